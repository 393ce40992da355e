// Shared by the process groups: argument checks, names for error messages, and the
// fingerprint that debug mode exchanges before each collective.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <ember/dist/process_group.h>

namespace ember::dist::detail {

enum class OpKind : int32_t {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduce,
  kReduceScatter,
  kBarrier,
  kSend,
  kRecv
};
const char* op_kind_name(OpKind kind);
const char* reduce_op_name(ReduceOp op);
bool is_collective(OpKind kind);

// True when EMBER_DIST_DEBUG is set to something other than "" or "0".
bool debug_from_env();

// Argument checks shared by every backend; each throws ember::Error naming the operation.
void check_tensor(const char* op, const Tensor& t);
void check_root(const char* op, int root, int size);
void check_peer(const char* op, int peer, int rank, int size);
void check_reduce_op(const char* op, const Tensor& t, ReduceOp reduce);
// `list` must hold `size` tensors shaped, typed and placed like `like`.
void check_list(const char* op, const char* what, const std::vector<Tensor>& list,
                const Tensor& like, int size);

// What debug mode compares across ranks: the collective, its sequence number, and the
// dtype, shape (first kMaxDims dims, plus a hash of all), root and reduce op.
struct Fingerprint {
  static constexpr int kMaxDims = 6;
  int32_t kind = 0;
  int32_t reduce = -1;
  int32_t root = -1;
  int32_t dtype = -1;
  int64_t seq = 0;
  int64_t numel = 0;
  int32_t ndim = 0;
  int32_t padding = 0;
  std::array<int64_t, kMaxDims> dims{};
  uint64_t shape_hash = 0;

  static Fingerprint of(OpKind kind, int64_t seq, const Tensor* t, int root, int reduce);
  bool operator==(const Fingerprint& other) const;
  std::string str() const;  // "allreduce #3 on f32 [4, 4] (sum)"
};
// The error debug mode reports on every rank when fingerprints differ, or "" when they agree.
std::string compare_fingerprints(const std::vector<Fingerprint>& all, int rank);

// "allreduce #17 on rank 1 timed out after 5000 ms (...)".
std::string timeout_message(const std::string& what, int rank, std::chrono::milliseconds limit,
                            const std::string& backend, int size);

// Divides `count` elements at `data` of a floating dtype by `divisor` in place (kAvg).
void divide_in_place(void* data, int64_t count, DType dtype, int divisor);

}  // namespace ember::dist::detail

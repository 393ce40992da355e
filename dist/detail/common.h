// Shared by the process groups: argument checks, names for error messages, and the
// fingerprint every rank exchanges before each collective. (The completion and
// numbering of the operations the MPI and TCP backends queue are the scheduler's:
// detail/scheduler.h.)
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
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
std::string op_name(OpKind kind, int64_t seq);  // "allreduce #17"
const char* reduce_op_name(ReduceOp op);
inline bool is_collective(OpKind kind) { return kind != OpKind::kSend && kind != OpKind::kRecv; }

// True when EMBER_DIST_DEBUG is set to something other than "" or "0".
bool debug_from_env();

// Argument checks shared by every backend; each throws ember::Error naming the operation.
// The two every collective makes test inline and report out of line: a small all-reduce's
// whole cost is overhead like theirs.
[[noreturn]] void report_bad_tensor(const char* op, const Tensor& t);
inline void check_tensor(const char* op, const Tensor& t) {
  if (!t.defined() || !t.is_contiguous()) [[unlikely]]
    report_bad_tensor(op, t);
}
void check_root(const char* op, int root, int size);
void check_peer(const char* op, int peer, int rank, int size);
[[noreturn]] void report_bad_reduce_op(const char* op, const Tensor& t);
inline void check_reduce_op(const char* op, const Tensor& t, ReduceOp reduce) {
  if (reduce == ReduceOp::kAvg && !t.is_floating_point()) [[unlikely]]
    report_bad_reduce_op(op, t);
}
// `list` must hold `size` tensors shaped, typed and placed like `like`.
void check_list(const char* op, const char* what, const std::vector<Tensor>& list,
                const Tensor& like, int size);

// What the ranks compare before each collective: the collective, its sequence number, and
// the dtype, shape (first kMaxDims dims, plus a hash of all), root and reduce op. A rank that
// leaves the group sends a goodbye instead (kind kGoodbye), naming the last collective it
// issued, so a rank still waiting on it learns at once who left and when.
struct Fingerprint {
  static constexpr int kMaxDims = 6;
  static constexpr int32_t kGoodbye = 100;
  int32_t kind = 0;
  int32_t reduce = -1;
  int32_t root = -1;
  int32_t dtype = -1;
  int64_t seq = 0;  // a goodbye's: the number its next collective would have had
  int64_t numel = 0;
  int32_t ndim = 0;
  int32_t last_kind = -1;  // a goodbye's: the OpKind of collective seq - 1 (-1: none)
  std::array<int64_t, kMaxDims> dims{};
  uint64_t shape_hash = 0;

  static Fingerprint of(OpKind kind, int64_t seq, const Tensor* t, int root, int reduce);
  // What a rank that issued `issued` collectives, the last a `last`, sends when it leaves.
  static Fingerprint goodbye(int64_t issued, int32_t last_kind);
  bool is_goodbye() const { return kind == kGoodbye; }
  bool operator==(const Fingerprint& other) const;
  // "allreduce #3 on f32 [4, 4] (sum)"; a goodbye: "left the group after allreduce #7".
  std::string str() const;
};
// The check every backend makes before every collective, once it gathered each rank's
// fingerprint (`all`, by rank) for its collective `op` ("barrier #8") on `rank`. When a rank
// said goodbye it throws ember::Error naming who left after which collective and where the
// others are (the group is unusable); when the collectives differ, FingerprintMismatch naming
// every rank's call. Either way every rank that waits sees the same and fails at once.
// `issued`: the collective already went to the backend (a check made beside it, not before
// it), so a mismatch leaves the group unusable too, and the message says so.
void check_fingerprints(const std::string& op, const std::vector<Fingerprint>& all, int rank,
                        bool issued = false);
// Thrown for such a mismatch: every rank sees it and skips the collective, so, unlike any
// other failure of an issued operation, it leaves the group in step and usable.
struct FingerprintMismatch : Error {
  using Error::Error;
};

// A group's timeout, checked (positive) and capped at 30 days, so a "never" value such as
// milliseconds::max() cannot overflow the deadlines computed from it.
inline constexpr std::chrono::milliseconds kLongestTimeout = std::chrono::hours(24 * 30);
std::chrono::milliseconds checked_timeout(const char* group, std::chrono::milliseconds timeout);
// The limit of one wait: `requested` (capped likewise) when positive, else the group's.
inline std::chrono::milliseconds wait_limit(std::chrono::milliseconds requested,
                                            std::chrono::milliseconds group_timeout) {
  return requested.count() > 0 ? std::min(requested, kLongestTimeout) : group_timeout;
}

// Writes why a group broke to stderr (flushed): "ember::dist: the mpi process group broke on
// rank 1: <message>". Each backend calls it once per group, when the group breaks, so the
// reason is on record even when the process ends before the caller reports the ember::Error
// (the MPI backend's destructor ends the job with MPI_Abort, possibly while the exception
// unwinds; a launcher stops the other ranks once one fails). Nothing is written otherwise.
void report_broken_group(const std::string& backend, int rank, const std::string& message);

// "allreduce #17 on rank 1 timed out after 5000 ms (...)".
std::string timeout_message(const std::string& what, int rank, std::chrono::milliseconds limit,
                            const std::string& backend, int size);

// Divides `count` elements at `data` of a floating dtype by `divisor` in place (kAvg).
void divide_in_place(void* data, int64_t count, DType dtype, int divisor);

}  // namespace ember::dist::detail

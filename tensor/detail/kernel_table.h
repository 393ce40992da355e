// The device-indexed kernel table: one entry per op family, filled side by side by the CPU
// kernels (tensor/cpu/) and the CUDA kernels (tensor/cuda/).
//
// NOTE: ops.cpp (the front end) validates every argument before calling a kernel, and hands
// kernels tensors that are already broadcast to the output's shape (stride-0 expanded) and
// of the dtypes each entry documents. Kernels never see user mistakes; what they assert is
// an ember bug.
#pragma once

#include <cstdint>

#include "../scalar.h"
#include "../tensor.h"

namespace ember::detail {

enum class UnaryOp : uint8_t {
  kNeg,
  kAbs,
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kRelu,
  kSigmoid,
  kTanh,
  kPowScalar,  // x ** a
  kClamp,      // min(max(x, a), b)
};

enum class BinaryOp : uint8_t {
  kAdd,  // a + alpha * b
  kSub,  // a - alpha * b
  kMul,
  kDiv,
  kPow,
  kMaximum,
  kMinimum,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,  // bool output
};
constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::kEq; }

enum class ReduceOp : uint8_t {
  kSum,
  kMean,
  kMax,
  kMin,
  kVar,   // divides by (n - correction)
  kNorm,  // (sum |x|^p)^(1/p); p = inf gives max |x|
};

enum class RandomKind : uint8_t {
  kUniform,  // [a, b)
  kNormal,   // mean a, stddev b
  kRandint,  // integers in [a, b)
};

struct GemmArgs {
  // Row-major: C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C, repeated `batch`
  // times with the given element strides between matrices. Leading dims are row strides.
  DType dtype = kF32;
  Device device;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;
};

struct KernelTable {
  // Memory for tensors on this device type (the index picks the CUDA device).
  Allocator* (*allocator)(int device_index) = nullptr;
  // out[...] = value, any dtype and strides.
  void (*fill)(const Tensor& out, Scalar value) = nullptr;
  // dst[...] = cast(src[...]); same shape (src may be stride-0 expanded), any dtypes.
  void (*copy)(const Tensor& dst, const Tensor& src) = nullptr;
  // out = op(in); out and in have the same dtype; params a, b as UnaryOp documents.
  void (*unary)(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) = nullptr;
  // out = op(a, b); a and b share a dtype; out has it too, or bool for comparisons.
  void (*binary)(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                 Scalar alpha) = nullptr;
  // out = cond ? a : b; cond bool, a/b/out one dtype.
  void (*where)(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) = nullptr;
  // in: contiguous, viewed as [outer, r]; out: contiguous, `outer` elements, same dtype.
  void (*reduce)(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t r,
                 double p, int64_t correction) = nullptr;
  // in: contiguous [outer, r]; values (in's dtype) and indices (i64) contiguous [outer].
  // NaN counts as larger than everything (as PyTorch), the first extreme wins ties.
  void (*arg_reduce)(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in,
                     int64_t outer, int64_t r) = nullptr;
  void (*gemm)(const GemmArgs& args) = nullptr;
  // in/out contiguous [outer, n, inner]; softmax (or log_softmax) along n.
  void (*softmax)(const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner,
                  bool log) = nullptr;
  // out [outer, k, inner] = in [outer, n, inner] at index[k] (i64, in range), all contiguous.
  void (*index_select)(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
                       int64_t n, int64_t inner) = nullptr;
  // out = in.gather(dim, index): out and index share a shape; all contiguous, index in range.
  void (*gather)(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) = nullptr;
  // self[...index...] += src along dim, in place; all contiguous, index in range.
  void (*scatter_add)(const Tensor& self, int64_t dim, const Tensor& index,
                      const Tensor& src) = nullptr;
  // out (contiguous, floating or integral) filled from Philox (seed, offset); params a, b.
  void (*random)(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a,
                 double b) = nullptr;
  // Copies between the host and this device type, or between two devices of it: dst and src
  // contiguous, same dtype and numel. Only the CUDA table has it.
  void (*transfer)(const Tensor& dst, const Tensor& src, bool non_blocking) = nullptr;
};

// The table for a device type; entries a build lacks are null (no CUDA build: all null).
const KernelTable& kernel_table(DeviceType type);

// Filled in by tensor/cpu/ and tensor/cuda/.
void register_cpu_kernels(KernelTable& table);
void register_cuda_kernels(KernelTable& table);

}  // namespace ember::detail

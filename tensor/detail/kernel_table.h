// The device-indexed kernel table: one entry per op family, filled side by side by the CPU
// kernels (tensor/cpu/NAME.cpp) and the CUDA kernels (tensor/cuda/NAME.cu), each file
// registering its own entries (EMBER_REGISTER_CPU_KERNELS / EMBER_REGISTER_CUDA_KERNELS).
//
// NOTE: ops.cpp (the front end) validates every argument before calling a kernel, and hands
// kernels tensors that are already broadcast to the output's shape (stride-0 expanded) and
// of the dtypes each entry documents. Kernels never see user mistakes; what they assert is
// an ember bug.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "../layer_ops.h"
#include "../multi_tensor.h"
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
  kPowScalar,  // x ** a, a rounded to the dtype first (as PyTorch does for f16/bf16)
  kClamp,      // min(max(x, a), b)
  // GPT layers: GELU, exact x * Phi(x) (erf) or its tanh approximation (PyTorch's formulas):
  // a is the GeluApproximate (detail/gelu_math.h's gelu_approximate_of).
  kGelu,
};

enum class BinaryOp : uint8_t {
  kAdd,  // a + alpha * b
  kSub,  // a - alpha * b
  kMul,
  kDiv,
  kPow,
  kMaximum,
  kMinimum,
  kReluBackward,  // b > 0 ? a : 0 (a: gradient, b: the relu's output)
  // GPT layers: a * gelu'(b) (a: gradient, b: the gelu's input); alpha is the GeluApproximate.
  kGeluBackward,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,  // bool output
};
constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::kEq; }

// Case labels for kernel switches that treat a group of ops alike (the ops a dtype does not
// take fall through to an assertion): with every label listed and no default, an op added to
// an enum without a case in such a switch does not compile (-Wswitch under -Werror).
#define EMBER_CASES_UNARY_FLOATING_ONLY \
  case UnaryOp::kExp:                   \
  case UnaryOp::kLog:                   \
  case UnaryOp::kSqrt:                  \
  case UnaryOp::kRsqrt:                 \
  case UnaryOp::kSigmoid:               \
  case UnaryOp::kTanh:                  \
  case UnaryOp::kGelu
#define EMBER_CASES_BINARY_COMPARISON \
  case BinaryOp::kEq:                 \
  case BinaryOp::kNe:                 \
  case BinaryOp::kLt:                 \
  case BinaryOp::kLe:                 \
  case BinaryOp::kGt:                 \
  case BinaryOp::kGe
#define EMBER_CASES_BINARY_ARITHMETIC \
  case BinaryOp::kAdd:                \
  case BinaryOp::kSub:                \
  case BinaryOp::kMul:                \
  case BinaryOp::kDiv:                \
  case BinaryOp::kPow:                \
  case BinaryOp::kMaximum:            \
  case BinaryOp::kMinimum:            \
  case BinaryOp::kReluBackward:       \
  case BinaryOp::kGeluBackward

// The reduce kernel's reductions along a dim. Deliberately not dist::ReduceOp
// (dist/process_group.h), the collectives' torch.distributed.ReduceOp: the two share kSum, kMax
// and kMin, but kVar and kNorm have no collective form, and one enum would let a collective
// take them (or the kernel take kAvg) and fail at run time instead of at compile time.
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
  // Optional bias epilogue: C = alpha * op(A) @ op(B) + bias, bias [n] contiguous, of C's
  // dtype, added to every row (beta must be 0). The CPU writes bias into C and runs with
  // beta 1 (the same arithmetic as addmm's copy); CUDA adds it in cuBLASLt's epilogue.
  const void* bias = nullptr;
};

struct Conv2dParams {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  int64_t groups = 1;
  // Input, weight, output and their gradients are all dense NHWC (else all NCHW); a tensor
  // with size-1 dims may carry either set of strides, its bytes being the same.
  bool channels_last = false;
};

struct Pool2dParams {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
  bool count_include_pad = true;  // average pooling: divide by the window including padding
  // The layout the op computed in (its input's suggested format), which its gradient takes.
  bool channels_last = false;
};

// Scaled-dot-product attention (attention.h): scores q_i . k_j * scale, keys j > i masked out
// when causal, and (dropout_p > 0) the dropout mask of draw (seed, offset) on the weights.
struct AttentionParams {
  double scale = 1.0;
  bool causal = false;
  double dropout_p = 0.0;
  uint64_t seed = 0, offset = 0;
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
  // --- layers: every tensor contiguous NCHW, one floating dtype; shapes checked by the front end.
  // out [N, O, Ho, Wo] = conv(input [N, C, H, W], weight [O, C/g, kH, kW]) + bias [O] (bias may
  // be undefined).
  void (*conv2d_forward)(const Tensor& out, const Tensor& input, const Tensor& weight,
                         const Tensor& bias, const Conv2dParams& params) = nullptr;
  // Fills each defined gradient (grad_input like input, grad_weight like weight, grad_bias [O]).
  void (*conv2d_backward)(const Tensor& grad_input, const Tensor& grad_weight,
                          const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                          const Tensor& weight, const Conv2dParams& params) = nullptr;
  // Batch norm over input [N, C, S] (S = spatial size, may be 1); weight/bias [C] may be
  // undefined (1 and 0). Training: batch mean and 1/sqrt(biased var + eps) go to save_mean /
  // save_invstd [C] (f32 for 16-bit inputs, else input's dtype), and running stats (if defined)
  // are updated with momentum and the unbiased variance. Eval: running stats normalise, and
  // save_mean/save_invstd receive them (mean and 1/sqrt(var + eps)).
  void (*batch_norm_forward)(const Tensor& out, const Tensor& save_mean, const Tensor& save_invstd,
                             const Tensor& input, const Tensor& weight, const Tensor& bias,
                             const Tensor& running_mean, const Tensor& running_var, bool training,
                             double momentum, double eps) = nullptr;
  // Gradients for a forward with the saved statistics; training includes the statistics'
  // dependence on the input, eval does not. Undefined outputs are skipped.
  void (*batch_norm_backward)(const Tensor& grad_input, const Tensor& grad_weight,
                              const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                              const Tensor& weight, const Tensor& save_mean,
                              const Tensor& save_invstd, bool training) = nullptr;
  // out/indices [N, C, Ho, Wo]; indices (i64) are flat positions h * W + w in the input plane.
  void (*max_pool2d_forward)(const Tensor& out, const Tensor& indices, const Tensor& input,
                             const Pool2dParams& params) = nullptr;
  // grad_input (zero-filled by the kernel) accumulates grad_out at the saved indices.
  void (*max_pool2d_backward)(const Tensor& grad_input, const Tensor& grad_out,
                              const Tensor& indices, const Pool2dParams& params) = nullptr;
  void (*avg_pool2d_forward)(const Tensor& out, const Tensor& input,
                             const Pool2dParams& params) = nullptr;
  void (*avg_pool2d_backward)(const Tensor& grad_input, const Tensor& grad_out,
                              const Pool2dParams& params) = nullptr;
  // Output cell (i, j) averages input rows [floor(i*H/Ho), ceil((i+1)*H/Ho)) and likewise columns.
  void (*adaptive_avg_pool2d_forward)(const Tensor& out, const Tensor& input) = nullptr;
  void (*adaptive_avg_pool2d_backward)(const Tensor& grad_input, const Tensor& grad_out) = nullptr;
  // Per-sample loss [N] of logits [N, C] against target [N] (i64, in range or ignore_index):
  // loss = lse - (1 - s) * x[target] - (s / C) * sum(x), with lse = logsumexp(x) saved [N];
  // ignored samples get loss 0.
  void (*cross_entropy_forward)(const Tensor& loss, const Tensor& lse, const Tensor& logits,
                                const Tensor& target, int64_t ignore_index,
                                double smoothing) = nullptr;
  // grad_logits [N, C] = grad_loss[n] * (softmax(x) - (1 - s) * onehot(target) - s / C); 0 if
  // ignored.
  void (*cross_entropy_backward)(const Tensor& grad_logits, const Tensor& grad_loss,
                                 const Tensor& logits, const Tensor& lse, const Tensor& target,
                                 int64_t ignore_index, double smoothing) = nullptr;
  // Copies between the host and this device type, or between two devices of it: dst and src
  // contiguous, same dtype and numel. Only the CUDA table has it.
  void (*transfer)(const Tensor& dst, const Tensor& src, bool non_blocking) = nullptr;
  // Loss scaling (GradScaler), one pass over every element of every tensor (contiguous,
  // floating, any mix of dtypes, all on this device; one kernel launch on CUDA): found_inf
  // (f32, 1 element) becomes 1 where an element is inf or NaN, and each element is multiplied
  // by inv_scale (f32, 1 element) in float unless inv_scale is exactly 1.
  void (*amp_non_finite_check_and_unscale)(const std::vector<Tensor>& tensors,
                                           const Tensor& found_inf,
                                           const Tensor& inv_scale) = nullptr;
  // The dynamic loss scale's update (amp_update_scale_), decided on this device: scale and
  // found_inf f32, growth_tracker i32, one element each.
  void (*amp_update_scale)(const Tensor& scale, const Tensor& growth_tracker,
                           const Tensor& found_inf, double growth_factor, double backoff_factor,
                           int64_t growth_interval) = nullptr;
  // --- scaled-dot-product attention: q [BH, Lq, E], k [BH, Lk, E], v [BH, Lk, Ev],
  // out [BH, Lq, Ev], one dtype, all contiguous; lse [BH, Lq] (f64 for f64 inputs, else f32)
  // receives each query row's logsumexp of its (masked, scaled) scores.
  void (*attention_forward)(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                            const Tensor& v, const AttentionParams& params) = nullptr;
  // Fills grad_q, grad_k, grad_v (shaped as q, k, v) from grad_out and the forward's saved
  // out and lse, recomputing the weights block by block.
  void (*attention_backward)(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                             const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionParams& params) = nullptr;
  // --- GPT layers.
  // Layer norm over the rows of input [rows, n] (contiguous): out = (x - mean) * rstd *
  // weight + bias, weight/bias [n] of input's dtype (either may be undefined: 1 and 0).
  // mean and rstd = 1 / sqrt(biased variance + eps) go to [rows] (f32 for 16-bit inputs, else
  // the input's dtype); statistics accumulate in at least f32.
  void (*layer_norm_forward)(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                             const Tensor& input, const Tensor& weight, const Tensor& bias,
                             double eps) = nullptr;
  // Gradients of that forward from its saved mean/rstd: grad_input [rows, n], grad_weight and
  // grad_bias [n] (weight's dtype, or input's when there is no weight), each skipped when
  // undefined. Column sums combine in a fixed order, so results do not depend on timing.
  void (*layer_norm_backward)(const Tensor& grad_input, const Tensor& grad_weight,
                              const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                              const Tensor& weight, const Tensor& mean,
                              const Tensor& rstd) = nullptr;
  // --- fused batch norm + ReLU (+ residual add) ---
  // out = relu(batch_norm(input) + residual) over [N, C, S], in one pass over the
  // activations: statistics, save_mean/save_invstd and running statistics as
  // batch_norm_forward; residual (input's dtype and layout) may be undefined (no add).
  void (*batch_norm_relu_forward)(const Tensor& out, const Tensor& save_mean,
                                  const Tensor& save_invstd, const Tensor& input,
                                  const Tensor& residual, const Tensor& weight, const Tensor& bias,
                                  const Tensor& running_mean, const Tensor& running_var,
                                  bool training, double momentum, double eps) = nullptr;
  // Its gradients from the output: the masked gradient gm = output > 0 ? grad_out : 0 goes to
  // grad_residual, and grad_input/grad_weight/grad_bias are batch_norm_backward's for gm.
  // Undefined outputs are skipped.
  void (*batch_norm_relu_backward)(const Tensor& grad_input, const Tensor& grad_residual,
                                   const Tensor& grad_weight, const Tensor& grad_bias,
                                   const Tensor& grad_out, const Tensor& output,
                                   const Tensor& input, const Tensor& weight,
                                   const Tensor& save_mean, const Tensor& save_invstd,
                                   bool training) = nullptr;
  // out = activation(in + bias) over contiguous [rows, n] (bias [n], may be undefined), one
  // floating dtype; fused linear's epilogue. activation is not kNone.
  void (*bias_activation)(Activation activation, const Tensor& out, const Tensor& in,
                          const Tensor& bias) = nullptr;
  // --- multi-tensor passes (multi_tensor.h), lists validated by tensor/multi_tensor.cpp: every
  // tensor flat, one device and dtype; device inputs on that device, of their dtypes; steps
  // holds either host or device counts. One OpenMP loop on the CPU, a few launches on CUDA.
  void (*multi_tensor_sgd)(std::span<const Tensor> params, std::span<const Tensor> grads,
                           std::span<const Tensor> momentum_buffers,
                           std::span<const uint8_t> new_buffer, const SGDUpdate& update,
                           const MultiTensorDeviceArgs& device) = nullptr;
  void (*multi_tensor_adam)(std::span<const Tensor> params, std::span<const Tensor> grads,
                            std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                            std::span<const Tensor> max_exp_avg_sqs, std::span<const int64_t> steps,
                            const AdamUpdate& update,
                            const MultiTensorDeviceArgs& device) = nullptr;
  // Partial sums of |x|^p over all elements of all tensors (maxima of |x| for p = inf), a 1-d
  // tensor on the tensors' device for the front end to add up there: the CPU's one total in
  // f64; CUDA's one per chunk, f32 (f64 for f64 tensors).
  Tensor (*multi_tensor_norm_partials)(std::span<const Tensor> tensors, double p) = nullptr;
  // Every element of every tensor times scale (0-d, the tensors' dtype, on their device).
  void (*multi_tensor_mul)(std::span<const Tensor> tensors, const Tensor& scale) = nullptr;
};

// Kernels one op owns, outside the shared table (an op added without touching shared lists):
// declared in the op's detail header, registered per device type by its kernel files and
// found by the front end with get() and require_kernel, like a table entry. Null where a
// build lacks one.
template <typename Fn>
struct OpKernels {
  Fn by_device[kNumDeviceTypes] = {};
  Fn get(DeviceType type) const { return by_device[static_cast<size_t>(type)]; }
};

// The table for a device type; entries a build lacks are null (no CUDA build: all null).
const KernelTable& kernel_table(DeviceType type);
// The same table, for the registrations below only (they run at start-up, before any op).
KernelTable& kernel_table_to_fill(DeviceType type);

// Registration, one convention on both devices: every kernel file registers what it defines,
// at start-up, and no list names the files: so ember builds shared libraries only (CMakeLists
// refuses BUILD_SHARED_LIBS=OFF), as a static archive's link drops the files nothing names.
//   tensor/cpu/NAME.cpp:  EMBER_REGISTER_CPU_KERNELS(NAME) { table.entry = entry_cpu; }
//                         EMBER_REGISTER_CPU_KERNEL(foo_kernels, foo_cpu);  (an op's own)
//   tensor/cuda/NAME.cu:  EMBER_REGISTER_CUDA_KERNELS(NAME) { table.entry = entry_cuda; }
//                         EMBER_REGISTER_CUDA_KERNEL(foo_kernels, foo_cuda);
// (cpu/cpu_kernels.h and cuda/device.cuh). Both build on these two:
// EMBER_REGISTER_TABLE_KERNELS(device_type, fn) { ... } defines fn(KernelTable& table), run on
// that device type's table at start-up; EMBER_REGISTER_OWN_KERNEL sets an OpKernels entry.
#define EMBER_REGISTER_TABLE_KERNELS(device_type, fn)                 \
  static void fn(::ember::detail::KernelTable& table);                \
  [[maybe_unused]] static const bool ember_registered_##fn =          \
      (fn(::ember::detail::kernel_table_to_fill(device_type)), true); \
  static void fn(::ember::detail::KernelTable& table)
#define EMBER_REGISTER_OWN_KERNEL(kernels, device_type, fn)  \
  [[maybe_unused]] static const bool ember_own_kernel_##fn = \
      ((kernels).by_device[static_cast<size_t>(device_type)] = (fn), true)

}  // namespace ember::detail

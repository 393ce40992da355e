// Tensor operations: factories, elementwise math with broadcasting and PyTorch's type
// promotion, reductions, linear algebra, softmax and indexing. Each op checks its
// arguments (throwing ember::Error that names the op and the values) and then runs the
// kernel for the tensors' device from the kernel table.
#pragma once

#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "tensor.h"

namespace ember {

// --- factories -------------------------------------------------------------------------
Tensor empty(const Shape& sizes, TensorOptions options = {});
Tensor zeros(const Shape& sizes, TensorOptions options = {});
Tensor ones(const Shape& sizes, TensorOptions options = {});
Tensor full(const Shape& sizes, Scalar value, TensorOptions options = {});
// An uninitialised tensor laid out in `format` (Contiguous or ChannelsLast).
Tensor empty(const Shape& sizes, TensorOptions options, MemoryFormat format);
// Same shape, dtype and device as t; Preserve keeps t.suggest_memory_format() (PyTorch keeps
// the exact strides of any dense layout; ember keeps NCHW or NHWC, the two it computes in).
Tensor empty_like(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor zeros_like(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor ones_like(const Tensor& t, MemoryFormat format = MemoryFormat::Preserve);
Tensor full_like(const Tensor& t, Scalar value, MemoryFormat format = MemoryFormat::Preserve);
// [0, end) and [start, end) by step; dtype i64 unless options say otherwise.
Tensor arange(Scalar end, TensorOptions options = kI64);
Tensor arange(Scalar start, Scalar end, Scalar step = 1, TensorOptions options = kI64);
// `steps` evenly spaced values from start to end inclusive.
Tensor linspace(double start, double end, int64_t steps, TensorOptions options = {});
// Copies host values into a new tensor of `sizes` (a 1-d tensor when sizes is empty).
template <typename T>
Tensor from_vector(const std::vector<T>& values, const Shape& sizes = {}, Device device = kCPU);
template <>
Tensor from_vector(const std::vector<bool>& values, const Shape& sizes, Device device);
// Wraps memory the caller owns, without copying: contiguous unless strides are given.
// `owner` (optional) is kept alive as long as any tensor views the memory.
Tensor from_blob(void* data, const Shape& sizes, DType dtype, Device device = kCPU,
                 std::shared_ptr<void> owner = nullptr, const Shape& strides = {});
// A 0-d tensor holding `value`, with `value`'s default dtype unless one is given.
Tensor scalar_tensor(Scalar value, TensorOptions options);
Tensor scalar_tensor(Scalar value);

// --- type promotion --------------------------------------------------------------------
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);
// Broadcast shape of a and b, or ember::Error naming `op` when they cannot broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");

// --- elementwise -----------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);  // a + alpha * b
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);  // a - alpha * b
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integers give floats
Tensor div(const Tensor& a, Scalar b);
Tensor pow(const Tensor& base, const Tensor& exponent);
Tensor pow(const Tensor& base, Scalar exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& t);
Tensor abs(const Tensor& t);
Tensor exp(const Tensor& t);
Tensor log(const Tensor& t);
Tensor sqrt(const Tensor& t);
Tensor rsqrt(const Tensor& t);
Tensor relu(const Tensor& t);
Tensor sigmoid(const Tensor& t);
Tensor tanh(const Tensor& t);
Tensor clamp(const Tensor& t, std::optional<Scalar> min, std::optional<Scalar> max);
// cond ? a : b elementwise, all three broadcast together; cond must be bool.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor where(const Tensor& cond, Scalar a, const Tensor& b);
// Comparisons give bool tensors.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
// True when shapes match and every |a - b| <= atol + rtol * |b| (NaNs unequal).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
// True when shapes and values match exactly.
bool equal(const Tensor& a, const Tensor& b);

// --- reductions (empty dims = all dims; negative dims count from the end) -------------
// Integer and bool sums are i64, as in PyTorch.
Tensor sum(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& t, const Shape& dims = {}, bool keepdim = false);
Tensor max(const Tensor& t);  // of all elements
Tensor min(const Tensor& t);
// Values and indices (i64) along one dim.
std::tuple<Tensor, Tensor> max(const Tensor& t, int64_t dim, bool keepdim = false);
std::tuple<Tensor, Tensor> min(const Tensor& t, int64_t dim, bool keepdim = false);
// Index of the largest (smallest) element: of the flattened tensor when dim is empty.
Tensor argmax(const Tensor& t, std::optional<int64_t> dim = {}, bool keepdim = false);
Tensor argmin(const Tensor& t, std::optional<int64_t> dim = {}, bool keepdim = false);
// Variance with Bessel's correction by default (correction = 1), as torch.var.
Tensor var(const Tensor& t, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& t, const Shape& dims = {}, int64_t correction = 1, bool keepdim = false);
// The p-norm (p may be any positive number or infinity) over dims.
Tensor norm(const Tensor& t, double p = 2.0, const Shape& dims = {}, bool keepdim = false);

// --- linear algebra (OpenBLAS on the CPU, cuBLAS on CUDA) -----------------------------
// torch.matmul semantics: 1-d/2-d products, and batched products that broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);
Tensor mm(const Tensor& a, const Tensor& b);   // [m, k] x [k, n]
Tensor bmm(const Tensor& a, const Tensor& b);  // [B, m, k] x [B, k, n]
// beta * input + alpha * (a @ b), input broadcast to [m, n].
Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, Scalar beta = 1,
             Scalar alpha = 1);

// --- softmax ---------------------------------------------------------------------------
Tensor softmax(const Tensor& t, int64_t dim);
Tensor log_softmax(const Tensor& t, int64_t dim);

// --- joining and indexing ---------------------------------------------------------------
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& t, int64_t dim, const Tensor& index);
// A copy of t with src added at the positions index names along dim.
Tensor scatter_add(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src);
// [..., num_classes] i64 with a 1 at each index (num_classes = max + 1 when -1).
Tensor one_hot(const Tensor& index, int64_t num_classes = -1);
Tensor masked_fill(const Tensor& t, const Tensor& mask, Scalar value);

}  // namespace ember

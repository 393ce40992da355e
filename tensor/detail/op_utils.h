// Helpers the op front ends (ops_*.cpp) share: dim wrapping, argument checks, and finding
// a tensor's kernels.
#pragma once

#include <string>
#include <vector>

#include "../tensor.h"
#include "kernel_table.h"

namespace ember::detail {

// Row-major strides for `sizes` (size-0 and size-1 dims count as 1).
Shape contiguous_strides(const Shape& sizes);
// ember::Error naming `op` and the shape unless sizes are 4-d, as channels_last needs.
void check_channels_last(const Shape& sizes, const char* op);
// NHWC strides {H*W*C, 1, W*C, C} for 4-d sizes [N, C, H, W] (checked as above).
Shape channels_last_strides(const Shape& sizes, const char* op);
// The strides of `format` (Contiguous or ChannelsLast) for sizes.
Shape format_strides(const Shape& sizes, MemoryFormat format, const char* op);
// The format a result computed from `operands` takes (PyTorch's TensorIterator rule, reduced
// to the two formats ember computes in): that of the first operand whose shape is the
// result's, when it suggests ChannelsLast; Contiguous otherwise.
MemoryFormat result_memory_format(std::initializer_list<const Tensor*> operands,
                                  const Shape& result);

// True for the channels-last [N, C, S] view batch norm's kernels take (strides
// {S * C, 1, C}, not also row-major): N * S rows of C channels.
bool is_channels_last_rows(const Tensor& t);
// Whether the pooling kernels walk `tensors` (all 4-d, dense in one layout) as channels_last:
// true when any of them is not NCHW-contiguous. A tensor dense in both layouts (C == 1, or
// H == W == 1) has the same bytes either way, so the others decide.
bool pooling_channels_last(std::initializer_list<const Tensor*> tensors);

// Turns a possibly negative dim into [0, ndim); ember::Error naming `op` when out of range.
// A 0-d tensor accepts dims 0 and -1, as in PyTorch.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// Wraps, sorts and de-duplicates a dim list (empty = all dims); ember::Error on repeats.
std::vector<int64_t> wrap_dims(const Shape& dims, int64_t ndim, const char* op);
// ember::Error naming `op` unless every defined tensor sits on the first one's device.
void check_same_device(std::initializer_list<const Tensor*> tensors, const char* op);
// ember::Error naming `op` when t is undefined.
void check_defined(const Tensor& t, const char* op, const char* arg = "input");

// The kernel table for t's device; ember::Error when that device has no kernels in this build.
const KernelTable& kernels_for(Device device, const char* op);
// `entry` of the table, or ember::Error "<op>: not available on <device> in this build".
template <typename Fn>
Fn require_kernel(Fn entry, Device device, const char* op) {
  EMBER_CHECK(entry != nullptr, op, "not available on ", device.str(), " in this build");
  return entry;
}

// A tensor's values along `dims` moved innermost and made contiguous: the layout the
// reduce/softmax kernels take. Returns the permuted, contiguous tensor.
Tensor move_dims_last(const Tensor& t, const std::vector<int64_t>& dims);

// --- for backward formulas (EMBER_OP descriptors)
// g summed over the dims in which `shape` was broadcast to g's shape.
Tensor sum_to(const Tensor& g, const Shape& shape);
// sign(x) as x's dtype: -1, 0 or 1.
Tensor sign_of(const Tensor& x);
// A gradient `g` of a reduction over `dims` (keepdim or not) spread back to `sizes`.
Tensor expand_reduced(const Tensor& g, const Shape& sizes, const Shape& dims, bool keepdim);

}  // namespace ember::detail

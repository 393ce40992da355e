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

}  // namespace ember::detail

#include "tensor_iter.h"

#include <array>

namespace ember::detail {

StridedIter make_iter(std::initializer_list<const Tensor*> operands) {
  EMBER_ASSERT(operands.size() >= 1 && operands.size() <= kMaxOperands);
  StridedIter it;
  const Tensor& out = **operands.begin();
  it.num_operands = static_cast<int>(operands.size());
  it.numel = out.numel();
  int op = 0;
  for (const Tensor* t : operands) {
    EMBER_ASSERT(t->sizes() == out.sizes(), "operand ", shape_str(t->sizes()), " vs ",
                 shape_str(out.sizes()));
    it.data[op++] = static_cast<char*>(t->data_ptr());
  }
  // Drop size-1 dims, then merge neighbours d-1, d whenever every operand steps through
  // them as one run (stride[d-1] == stride[d] * size[d]).
  // NOTE: a channels-last output is walked in its memory order (N, H, W, C), so that operands
  // of its layout coalesce into one flat run, as TensorIterator reorders dims by stride.
  // Every user of the iterator (fill, copy, unary, binary, where) is order-independent.
  constexpr std::array<int64_t, 4> cl_order{0, 2, 3, 1};
  const bool cl =
      out.dim() == 4 && !out.is_contiguous() && out.is_contiguous(MemoryFormat::ChannelsLast);
  int ndim = 0;
  for (int64_t k = 0; k < out.dim(); ++k) {
    const int64_t d = cl ? cl_order[static_cast<size_t>(k)] : k;
    if (out.sizes()[d] == 1) continue;
    op = 0;
    bool mergeable = ndim > 0;
    for (const Tensor* t : operands) {
      if (mergeable && it.strides[op][ndim - 1] != t->strides()[d] * out.sizes()[d])
        mergeable = false;
      ++op;
    }
    if (mergeable) {
      it.sizes[ndim - 1] *= out.sizes()[d];
      op = 0;
      for (const Tensor* t : operands) it.strides[op++][ndim - 1] = t->strides()[d];
      continue;
    }
    EMBER_CHECK(ndim < kMaxDims, "elementwise", "tensors with more than ", kMaxDims,
                " non-mergeable dims are not supported (shape ", shape_str(out.sizes()), ")");
    it.sizes[ndim] = out.sizes()[d];
    op = 0;
    for (const Tensor* t : operands) it.strides[op++][ndim] = t->strides()[d];
    ++ndim;
  }
  it.ndim = ndim;
  it.contiguous = ndim <= 1;
  for (int o = 0; o < it.num_operands && it.contiguous; ++o) {
    if (ndim == 1 && it.strides[o][0] != 1) it.contiguous = false;
  }
  return it;
}

}  // namespace ember::detail

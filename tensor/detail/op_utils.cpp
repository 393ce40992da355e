#include "op_utils.h"

#include <algorithm>
#include <numeric>

#include "../ops.h"

namespace ember::detail {

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t stride = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(sizes[i], 1);
  }
  return strides;
}

void check_channels_last(const Shape& sizes, const char* op) {
  EMBER_CHECK(sizes.size() == 4, op, "channels_last needs a 4-d tensor [N, C, H, W], got shape ",
              shape_str(sizes));
}

Shape channels_last_strides(const Shape& sizes, const char* op) {
  check_channels_last(sizes, op);
  const int64_t c = std::max<int64_t>(sizes[1], 1), h = std::max<int64_t>(sizes[2], 1),
                w = std::max<int64_t>(sizes[3], 1);
  return {h * w * c, 1, w * c, c};
}

Shape format_strides(const Shape& sizes, MemoryFormat format, const char* op) {
  EMBER_ASSERT(format != MemoryFormat::Preserve, op);
  return format == MemoryFormat::ChannelsLast ? channels_last_strides(sizes, op)
                                              : contiguous_strides(sizes);
}

MemoryFormat result_memory_format(std::initializer_list<const Tensor*> operands,
                                  const Shape& result) {
  if (result.size() != 4) return MemoryFormat::Contiguous;
  for (const Tensor* t : operands) {
    if (t != nullptr && t->defined() && t->sizes() == result) return t->suggest_memory_format();
  }
  return MemoryFormat::Contiguous;
}

bool is_channels_last_rows(const Tensor& t) {
  return t.defined() && t.dim() == 3 && !t.is_contiguous() && t.stride(1) == 1 &&
         t.stride(2) == t.size(1) && (t.size(0) == 1 || t.stride(0) == t.size(1) * t.size(2));
}

bool pooling_channels_last(std::initializer_list<const Tensor*> tensors) {
  return std::any_of(tensors.begin(), tensors.end(),
                     [](const Tensor* t) { return !t->is_contiguous(); });
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  EMBER_CHECK(dim >= -n && dim < n, op, "dim ", dim, " is out of range for a tensor with ", ndim,
              " dims (expected [", -n, ", ", n - 1, "])");
  return dim < 0 ? dim + n : dim;
}

std::vector<int64_t> wrap_dims(const Shape& dims, int64_t ndim, const char* op) {
  std::vector<int64_t> result;
  if (dims.empty()) {
    result.resize(static_cast<size_t>(ndim));
    std::iota(result.begin(), result.end(), 0);
    return result;
  }
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, ndim, op);
    EMBER_CHECK(std::find(result.begin(), result.end(), w) == result.end(), op, "dim ", d,
                " appears more than once in ", shape_str(dims));
    result.push_back(w);
  }
  std::sort(result.begin(), result.end());
  // A 0-d tensor reduces over "dim 0", which it does not have.
  if (ndim == 0) result.clear();
  return result;
}

void check_same_device(std::initializer_list<const Tensor*> tensors, const char* op) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
      continue;
    }
    EMBER_CHECK(t->device() == first->device(), op, "expected all tensors on one device, found ",
                first->device().str(), " and ", t->device().str());
  }
}

void check_defined(const Tensor& t, const char* op, const char* arg) {
  EMBER_CHECK(t.defined(), op, "argument '", arg, "' is an undefined tensor");
}

const KernelTable& kernels_for(Device device, const char* op) {
  const KernelTable& table = kernel_table(device.type);
  EMBER_CHECK(table.fill != nullptr, op, "no kernels for ", device.str(),
              device.is_cuda() ? ": ember was built without CUDA" : "");
  return table;
}

Tensor move_dims_last(const Tensor& t, const std::vector<int64_t>& dims) {
  Shape order;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) order.push_back(d);
  }
  order.insert(order.end(), dims.begin(), dims.end());
  return t.permute(order).contiguous();
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.sizes() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t d = 0; d < g.dim(); ++d) {
    if (d < lead || (shape[static_cast<size_t>(d - lead)] == 1 && g.size(d) != 1))
      dims.push_back(d);
  }
  Tensor reduced = dims.empty() ? g : sum(g, dims, true);
  return reduced.reshape(shape);
}

Tensor sign_of(const Tensor& x) { return gt(x, 0).to(x.dtype()) - lt(x, 0).to(x.dtype()); }

Tensor expand_reduced(const Tensor& g, const Shape& sizes, const Shape& dims, bool keepdim) {
  Tensor out = g;
  if (!keepdim && !sizes.empty()) {
    const std::vector<int64_t> wrapped =
        wrap_dims(dims, static_cast<int64_t>(sizes.size()), "backward");
    for (int64_t d : wrapped) out = out.unsqueeze(d);
  }
  return out.expand(sizes);
}

}  // namespace ember::detail

#include "tensor.h"

#include <algorithm>
#include <numeric>

#include "detail/autograd_hooks.h"
#include "detail/dispatch.h"
#include "detail/kernel_table.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {

using detail::AutogradScope;
using detail::OpArgs;

namespace {

// --- descriptors --------------------------------------------------------------------------

std::vector<Tensor> identity_backward(const detail::BackwardContext&, const Tensor& g) {
  return {g};
}
std::vector<Tensor> reshape_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g.reshape(c.shape(0))};
}
// OpArgs::dim, dim2: the swapped dims.
std::vector<Tensor> transpose_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g.transpose(c.args().dim, c.args().dim2)};
}
// OpArgs::dims: the permutation.
std::vector<Tensor> permute_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Shape& dims = c.args().dims;
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[static_cast<size_t>(dims[i])] = static_cast<int64_t>(i);
  return {g.permute(inverse)};
}
// A slice's (or a selected index's) gradient: zeros of the input's shape holding g there.
// PyTorch's slice_backward and select_backward, ops of their own so that a create_graph
// backward records them; their own gradient is the same slice of theirs. OpArgs::dim, start,
// step (select: dim, start = the index, step = 0); OpArgs::dims: the input's shape.
Tensor placed_in_zeros(const Tensor& g, const OpArgs& view);
std::vector<Tensor> placed_in_zeros_backward(const detail::BackwardContext& c, const Tensor& g) {
  const OpArgs& a = c.args();
  if (a.step == 0) return {g.select(a.dim, a.start)};
  return {g.slice(a.dim, a.start, a.start + c.shape(0)[a.dim] * a.step, a.step)};
}
std::vector<Tensor> slice_backward(const detail::BackwardContext& c, const Tensor& g) {
  OpArgs view = c.args();
  view.dims = c.shape(0);
  return {placed_in_zeros(g, view)};
}
std::vector<Tensor> expand_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {detail::sum_to(g, c.shape(0))};
}

// Views and copies: no kernels of their own (a copy runs the copy kernel).
EMBER_OP(kCastOp, detail::define_op("_to_copy", "ToCopyBackward", detail::saves({}, false),
                                    identity_backward, detail::kNoAutocast,
                                    detail::uses_kernels({EMBER_KERNEL(copy)})));
EMBER_OP(kReshapeOp,
         detail::define_op("reshape", "ReshapeBackward", detail::saves({}, false), reshape_backward,
                           detail::kNoAutocast, detail::uses_kernels({})));
EMBER_OP(kTransposeOp,
         detail::define_op("transpose", "TransposeBackward", detail::saves({}, false),
                           transpose_backward, detail::kNoAutocast, detail::uses_kernels({})));
EMBER_OP(kPermuteOp,
         detail::define_op("permute", "PermuteBackward", detail::saves({}, false), permute_backward,
                           detail::kNoAutocast, detail::uses_kernels({})));
EMBER_OP(kSliceOp,
         detail::define_op("slice", "SliceBackward", detail::saves({}, false), slice_backward,
                           detail::kNoAutocast, detail::uses_kernels({})));
EMBER_OP(kSelectOp,
         detail::define_op("select", "SelectBackward", detail::saves({}, false), slice_backward,
                           detail::kNoAutocast, detail::uses_kernels({})));
EMBER_OP(kPlacedInZerosOp,
         detail::define_op("slice_backward", "SliceBackwardBackward", detail::saves({}, false),
                           placed_in_zeros_backward, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(fill), EMBER_KERNEL(copy)})));
EMBER_OP(kExpandOp,
         detail::define_op("expand", "ExpandBackward", detail::saves({}, false), expand_backward,
                           detail::kNoAutocast, detail::uses_kernels({})));
EMBER_OP(kCloneOp,
         detail::define_op("clone", "CloneBackward", detail::saves({}, false), identity_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(copy)})));

Tensor placed_in_zeros(const Tensor& g, const OpArgs& view) {
  AutogradScope scope(kPlacedInZerosOp, {&g});
  Tensor result = zeros(view.dims, g.options());
  if (view.step == 0) {
    result.select(view.dim, view.start).copy_(g);
  } else {
    result.slice(view.dim, view.start, view.start + g.size(view.dim) * view.step, view.step)
        .copy_(g);
  }
  OpArgs args = view;
  return scope.finish(result, std::move(args));
}

using detail::contiguous_strides;

int64_t checked_numel(const Shape& sizes, const char* op) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    EMBER_CHECK(s >= 0, op, "negative size in shape ", shape_str(sizes));
    n *= s;
  }
  return n;
}

// Fills in a single -1 so that the shape holds `numel` elements.
Shape infer_size(const Shape& shape, int64_t numel, const char* op) {
  Shape result = shape;
  int64_t known = 1;
  std::optional<size_t> infer;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      EMBER_CHECK(!infer, op, "only one dimension can be -1 in ", shape_str(shape));
      infer = i;
    } else {
      EMBER_CHECK(shape[i] >= 0, op, "invalid size ", shape[i], " in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer) {
    EMBER_CHECK(known != 0 && numel % known == 0, op, "shape ", shape_str(shape),
                " is invalid for input of size ", numel);
    result[*infer] = numel / known;
  } else {
    EMBER_CHECK(known == numel, op, "shape ", shape_str(shape), " is invalid for input of size ",
                numel);
  }
  return result;
}

// Strides that view (sizes, strides) as new_sizes without copying, if any exist.
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides,
                                  const Shape& new_sizes) {
  Shape result(new_sizes.size());
  if (sizes.empty()) return Shape(new_sizes.size(), 1);
  if (std::find(sizes.begin(), sizes.end(), 0) != sizes.end()) return contiguous_strides(new_sizes);
  // Walk chunks of old dims that are contiguous among themselves, matching new dims to them.
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        result[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return result;
}

}  // namespace

const char* memory_format_name(MemoryFormat format) {
  switch (format) {
    case MemoryFormat::Contiguous:
      return "contiguous_format";
    case MemoryFormat::ChannelsLast:
      return "channels_last";
    case MemoryFormat::Preserve:
      return "preserve_format";
  }
  return "?";
}

std::ostream& operator<<(std::ostream& out, MemoryFormat format) {
  return out << memory_format_name(format);
}

std::string shape_str(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

Tensor::Tensor(Storage storage, DType dtype, Shape sizes, Shape strides, int64_t storage_offset)
    : impl_(std::make_shared<Impl>()) {
  EMBER_ASSERT(sizes.size() == strides.size(), "sizes ", shape_str(sizes), " strides ",
               shape_str(strides));
  impl_->numel = checked_numel(sizes, "tensor");
  impl_->storage = std::move(storage);
  impl_->dtype = dtype;
  impl_->sizes = std::move(sizes);
  impl_->strides = std::move(strides);
  impl_->offset = storage_offset;
}

void Tensor::throw_undefined() { throw Error("tensor: operation on an undefined tensor"); }

// wrap_dim lets reductions name dim 0 / -1 of a 0-d tensor (as PyTorch does); a 0-d tensor
// still has no size or stride to read, so it is refused here (PyTorch's IndexError).
int64_t Tensor::size(int64_t d) const {
  EMBER_CHECK(dim() > 0, "size", "a 0-d tensor has no dims (asked for dim ", d, ")");
  return sizes()[detail::wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  EMBER_CHECK(dim() > 0, "stride", "a 0-d tensor has no dims (asked for dim ", d, ")");
  return strides()[detail::wrap_dim(d, dim(), "stride")];
}

bool Tensor::is_contiguous() const {
  const Impl& i = impl();
  if (i.numel == 0) return true;
  int64_t expected = 1;
  for (size_t d = i.sizes.size(); d-- > 0;) {
    if (i.sizes[d] == 1) continue;
    if (i.strides[d] != expected) return false;
    expected *= i.sizes[d];
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  EMBER_CHECK(format != MemoryFormat::Preserve, "is_contiguous",
              "preserve_format is not a layout a tensor can have");
  if (format == MemoryFormat::Contiguous) return is_contiguous();
  const Impl& i = impl();
  if (i.sizes.size() != 4) return false;
  if (i.numel == 0) return true;
  int64_t expected = 1;
  for (const size_t d : {1, 3, 2, 0}) {  // NHWC: innermost first
    if (i.sizes[d] == 1) continue;
    if (i.strides[d] != expected) return false;
    expected *= i.sizes[d];
  }
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  // NOTE: PyTorch's is_channels_last_strides_2d: the strides, taken in NHWC order, never
  // decrease, each dim starting past the extent of the ones inside it. Size-1 dims make
  // both layouts dense; this ordering is what tells them apart.
  const Impl& i = impl();
  if (i.sizes.size() != 4) return MemoryFormat::Contiguous;
  int64_t min = 0;
  for (const size_t d : {1, 3, 2, 0}) {
    if (i.sizes[d] == 0 || i.strides[d] < min) return MemoryFormat::Contiguous;
    // [N, C, 1, 1]-like cases where N's stride equals C's cannot be told apart: NCHW wins.
    if (d == 0 && min == i.strides[1]) return MemoryFormat::Contiguous;
    min = i.strides[d];
    if (i.sizes[d] > 1) min *= i.sizes[d];
  }
  return MemoryFormat::ChannelsLast;
}

Scalar Tensor::item() const {
  EMBER_CHECK(numel() == 1, "item", "a tensor with ", numel(), " elements (shape ",
              shape_str(sizes()), ") cannot be converted to a scalar");
  const Tensor host = to(kCPU);
  return detail::dispatch_all(dtype(), "item", [&](auto tag) -> Scalar {
    using T = typename decltype(tag)::type;
    return Scalar(*static_cast<const T*>(host.data_ptr()));
  });
}

// --- views -----------------------------------------------------------------------------

Tensor Tensor::as_strided(const Shape& new_sizes, const Shape& new_strides,
                          std::optional<int64_t> offset) const {
  EMBER_CHECK(new_sizes.size() == new_strides.size(), "as_strided", "sizes ", shape_str(new_sizes),
              " and strides ", shape_str(new_strides), " differ in length");
  EMBER_CHECK(!detail::grad_needed({this}), "as_strided",
              "is not differentiable; detach() the tensor first");
  const int64_t off = offset.value_or(storage_offset());
  EMBER_CHECK(off >= 0, "as_strided", "negative storage offset ", off);
  int64_t last = off;  // furthest element the view reaches
  bool empty = false;
  for (size_t d = 0; d < new_sizes.size(); ++d) {
    EMBER_CHECK(new_sizes[d] >= 0 && new_strides[d] >= 0, "as_strided", "invalid sizes ",
                shape_str(new_sizes), " or strides ", shape_str(new_strides));
    if (new_sizes[d] == 0)
      empty = true;
    else
      last += (new_sizes[d] - 1) * new_strides[d];
  }
  const int64_t capacity = static_cast<int64_t>(storage().nbytes() / element_size());
  EMBER_CHECK(empty || last < capacity, "as_strided", "view of sizes ", shape_str(new_sizes),
              " strides ", shape_str(new_strides), " offset ", off, " reaches element ", last,
              " but the storage holds ", capacity);
  Tensor result(storage(), dtype(), new_sizes, new_strides, off);
  return result;
}

Tensor Tensor::view(const Shape& shape) const {
  const Shape new_sizes = infer_size(shape, numel(), "view");
  auto new_strides = view_strides(sizes(), strides(), new_sizes);
  EMBER_CHECK(new_strides.has_value(), "view", "cannot view a tensor of shape ", shape_str(sizes()),
              " and strides ", shape_str(strides()), " as ", shape_str(new_sizes),
              "; use reshape() (it copies when needed)");
  AutogradScope scope(kReshapeOp, {this});
  return scope.finish(Tensor(storage(), dtype(), new_sizes, *new_strides, storage_offset()));
}

Tensor Tensor::reshape(const Shape& shape) const {
  const Shape new_sizes = infer_size(shape, numel(), "reshape");
  AutogradScope scope(kReshapeOp, {this});
  if (auto new_strides = view_strides(sizes(), strides(), new_sizes)) {
    return scope.finish(Tensor(storage(), dtype(), new_sizes, *new_strides, storage_offset()));
  }
  return scope.finish(clone().view(new_sizes));
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int64_t a = detail::wrap_dim(dim0, dim(), "transpose");
  const int64_t b = detail::wrap_dim(dim1, dim(), "transpose");
  Shape s = sizes(), st = strides();
  if (dim() > 0) {
    std::swap(s[a], s[b]);
    std::swap(st[a], st[b]);
  }
  AutogradScope scope(kTransposeOp, {this});
  OpArgs args;
  args.dim = a;
  args.dim2 = b;
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset()), std::move(args));
}

Tensor Tensor::t() const {
  EMBER_CHECK(dim() <= 2, "t", "expects a tensor with <= 2 dims, got shape ", shape_str(sizes()));
  return dim() < 2 ? transpose(0, 0) : transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  EMBER_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute", "got ", dims.size(), " dims ",
              shape_str(dims), " for a tensor of shape ", shape_str(sizes()));
  Shape s(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  Shape order;
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = detail::wrap_dim(dims[i], dim(), "permute");
    EMBER_CHECK(!seen[d], "permute", "dim ", dims[i], " repeats in ", shape_str(dims));
    seen[d] = true;
    s[i] = sizes()[d];
    st[i] = strides()[d];
    order.push_back(d);
  }
  AutogradScope scope(kPermuteOp, {this});
  OpArgs args;
  args.dims = std::move(order);
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset()), std::move(args));
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  EMBER_CHECK(dim() > 0, "narrow", "cannot narrow a 0-d tensor");
  const int64_t wd = detail::wrap_dim(d, dim(), "narrow");
  const int64_t n = sizes()[wd];
  if (start < 0) start += n;
  EMBER_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow", "start ", start,
              " and length ", length, " are out of range for dim ", d, " of size ", n);
  return slice(wd, start, start + length);
}

Tensor Tensor::slice(int64_t d, std::optional<int64_t> start, std::optional<int64_t> end,
                     int64_t step) const {
  EMBER_CHECK(dim() > 0, "slice", "cannot slice a 0-d tensor");
  const int64_t wd = detail::wrap_dim(d, dim(), "slice");
  EMBER_CHECK(step > 0, "slice", "step must be positive, got ", step);
  const int64_t n = sizes()[wd];
  auto clamp_index = [n](int64_t i) {
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  const int64_t b = clamp_index(start.value_or(0));
  const int64_t e = std::max(b, clamp_index(end.value_or(n)));
  Shape s = sizes(), st = strides();
  s[wd] = (e - b + step - 1) / step;
  st[wd] *= step;
  AutogradScope scope(kSliceOp, {this});
  OpArgs args;
  args.dim = wd;
  args.start = b;
  args.step = step;
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset() + b * strides()[wd]),
                      std::move(args));
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  EMBER_CHECK(dim() > 0, "select", "cannot select from a 0-d tensor");
  const int64_t wd = detail::wrap_dim(d, dim(), "select");
  const int64_t n = sizes()[wd];
  EMBER_CHECK(index >= -n && index < n, "select", "index ", index, " is out of range for dim ", d,
              " of size ", n);
  if (index < 0) index += n;
  Shape s = sizes(), st = strides();
  s.erase(s.begin() + wd);
  st.erase(st.begin() + wd);
  AutogradScope scope(kSelectOp, {this});
  OpArgs args;
  args.dim = wd;
  args.start = index;
  args.step = 0;  // the gradient's placement (slice_backward) takes step 0 for a select
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset() + index * strides()[wd]),
                      std::move(args));
}

Tensor Tensor::expand(const Shape& shape) const {
  EMBER_CHECK(shape.size() >= sizes().size(), "expand", "cannot expand shape ", shape_str(sizes()),
              " to ", shape_str(shape), " (fewer dims)");
  const size_t lead = shape.size() - sizes().size();
  Shape s(shape.size()), st(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      EMBER_CHECK(shape[i] >= 0, "expand", "size -1 is not allowed in a new leading dim of ",
                  shape_str(shape));
      s[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t have = sizes()[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    if (have == want) {
      s[i] = have;
      st[i] = strides()[i - lead];
    } else {
      EMBER_CHECK(have == 1, "expand", "cannot expand shape ", shape_str(sizes()), " to ",
                  shape_str(shape));
      s[i] = want;
      st[i] = 0;
    }
  }
  AutogradScope scope(kExpandOp, {this});
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset()));
}

Tensor Tensor::squeeze() const {
  Shape s, st;
  for (int64_t d = 0; d < dim(); ++d) {
    if (sizes()[d] != 1) {
      s.push_back(sizes()[d]);
      st.push_back(strides()[d]);
    }
  }
  AutogradScope scope(kReshapeOp, {this});
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset()));
}

Tensor Tensor::squeeze(int64_t d) const {
  Shape s = sizes(), st = strides();
  if (dim() > 0) {
    const int64_t wd = detail::wrap_dim(d, dim(), "squeeze");
    if (sizes()[wd] == 1) {
      s.erase(s.begin() + wd);
      st.erase(st.begin() + wd);
    }
  }
  AutogradScope scope(kReshapeOp, {this});
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset()));
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const int64_t wd = detail::wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = sizes(), st = strides();
  const int64_t new_stride = wd < dim() ? sizes()[wd] * strides()[wd] : 1;
  s.insert(s.begin() + wd, 1);
  st.insert(st.begin() + wd, new_stride);
  AutogradScope scope(kReshapeOp, {this});
  return scope.finish(Tensor(storage(), dtype(), s, st, storage_offset()));
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  const int64_t a = detail::wrap_dim(start_dim, dim(), "flatten");
  const int64_t b = detail::wrap_dim(end_dim, dim(), "flatten");
  EMBER_CHECK(a <= b, "flatten", "start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape s(sizes().begin(), sizes().begin() + a);
  int64_t n = 1;
  for (int64_t d = a; d <= b; ++d) n *= sizes()[d];
  s.push_back(n);
  s.insert(s.end(), sizes().begin() + b + 1, sizes().end());
  return reshape(s);
}

Tensor Tensor::detach() const {
  Tensor result(storage(), dtype(), sizes(), strides(), storage_offset());
  result.set_wrapped_number(is_wrapped_number());
  return result;
}

void Tensor::set_data(const Tensor& other) const {
  detail::check_defined(other, "set_data", "other");
  Impl& self = impl();
  const Impl& from = other.impl();
  self.storage = from.storage;
  self.dtype = from.dtype;
  self.sizes = from.sizes;
  self.strides = from.strides;
  self.offset = from.offset;
  self.numel = from.numel;
  if (self.autograd && self.autograd->grad.defined()) {
    Tensor& grad = self.autograd->grad;
    grad = grad.sizes() == self.sizes ? grad.to(device(), dtype()) : Tensor();
  }
}

// --- copies ----------------------------------------------------------------------------

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

namespace {

// A differentiable copy of t laid out in `format`.
Tensor copy_in_format(const Tensor& t, MemoryFormat format) {
  AutogradScope scope(kCloneOp, {&t});
  Tensor result = empty(t.sizes(), t.options(), format);
  result.copy_(t);
  return scope.finish(result);
}

void check_format_fits(const Tensor& t, MemoryFormat format, const char* op) {
  if (format == MemoryFormat::ChannelsLast) detail::check_channels_last(t.sizes(), op);
}

}  // namespace

Tensor Tensor::contiguous(MemoryFormat format) const {
  EMBER_CHECK(format != MemoryFormat::Preserve, "contiguous",
              "preserve_format is not a layout to make a tensor contiguous in");
  check_format_fits(*this, format, "contiguous");
  return is_contiguous(format) ? *this : copy_in_format(*this, format);
}

// As PyTorch: to() aliases when the suggested format already matches, so an [N, 1, H, W]
// tensor (dense in both layouts) is re-strided by to(ChannelsLast) but not by contiguous().
Tensor Tensor::to(MemoryFormat format) const {
  if (format == MemoryFormat::Preserve) return *this;
  check_format_fits(*this, format, "to");
  return suggest_memory_format() == format ? *this : copy_in_format(*this, format);
}

Tensor Tensor::clone(MemoryFormat format) const {
  if (format == MemoryFormat::Preserve) format = suggest_memory_format();
  check_format_fits(*this, format, "clone");
  return copy_in_format(*this, format);
}

Tensor Tensor::clone() const {
  AutogradScope scope(kCloneOp, {this});
  Tensor result = empty(sizes(), options());
  result.copy_(*this);
  return scope.finish(result);
}

Tensor& Tensor::copy_(const Tensor& src, bool non_blocking) {
  detail::check_defined(src, "copy_", "src");
  detail::check_inplace("copy_", *this, {&src});
  const Shape target = sizes();
  EMBER_CHECK(broadcast_shapes(target, src.sizes(), "copy_") == target, "copy_", "source of shape ",
              shape_str(src.sizes()), " cannot be broadcast to ", shape_str(target));
  if (numel() == 0) return *this;
  storage().bump_version();
  if (src.device() == device()) {
    Tensor source = src.expand(target);
    if (source.storage().is_same(storage())) {
      const bool identical = source.data_ptr() == data_ptr() && source.strides() == strides();
      if (identical && src.dtype() == dtype()) return *this;
      if (!identical) source = source.clone();  // overlapping views: read from a snapshot
    }
    detail::require_kernel(detail::kernels_for(device(), "copy_").copy, device(), "copy_")(*this,
                                                                                           source);
    return *this;
  }
  // Across devices: convert on the source device, move contiguous bytes, scatter on arrival.
  const Device from = src.device(), to_device = device();
  const Device cuda_side = from.is_cuda() ? from : to_device;
  auto transfer =
      detail::require_kernel(detail::kernels_for(cuda_side, "copy_").transfer, cuda_side, "copy_");
  // A dense NCHW or NHWC destination takes the bytes of a source packed in its layout.
  const MemoryFormat layout = !is_contiguous() && is_contiguous(MemoryFormat::ChannelsLast)
                                  ? MemoryFormat::ChannelsLast
                                  : MemoryFormat::Contiguous;
  const Tensor packed = src.to(dtype()).expand(target).contiguous(layout);
  if (is_contiguous(layout)) {
    transfer(*this, packed, non_blocking);
  } else {
    Tensor staging = empty(target, options());
    transfer(staging, packed, false);
    copy_(staging);
  }
  return *this;
}

Tensor Tensor::to(Device target, bool non_blocking) const {
  return to(target, dtype(), non_blocking);
}

Tensor Tensor::to(DType target) const { return to(device(), target); }

Tensor Tensor::to(Device target_device, DType target_dtype, bool non_blocking) const {
  if (target_device == device() && target_dtype == dtype()) return *this;
  // Only float-to-float conversions carry gradients (as in PyTorch).
  const bool differentiable = is_floating(target_dtype);
  AutogradScope scope(kCastOp, {differentiable ? this : nullptr});
  // The copy keeps the memory format (PyTorch's memory_format=torch.preserve_format).
  Tensor result =
      empty(sizes(), TensorOptions(target_dtype, target_device), suggest_memory_format());
  result.copy_(*this, non_blocking);
  return scope.finish(result);
}

Tensor Tensor::pin_memory() const {
  EMBER_CHECK(is_cpu(), "pin_memory", "only CPU tensors can be pinned, this one is on ",
              device().str());
  Tensor result = empty(sizes(), options().with_pinned_memory());
  result.copy_(*this);
  return result;
}

Tensor& Tensor::fill_(Scalar value) {
  detail::check_inplace("fill_", *this);
  if (numel() == 0) return *this;
  storage().bump_version();
  detail::require_kernel(detail::kernels_for(device(), "fill_").fill, device(), "fill_")(*this,
                                                                                         value);
  return *this;
}

}  // namespace ember

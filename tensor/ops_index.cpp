// Joining and indexing: cat, stack, index_select, gather, scatter_add, one_hot, masked_fill.
#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {
namespace {

// --- descriptors --------------------------------------------------------------------------

// OpArgs::dim: the dim concatenated along.
std::vector<Tensor> cat_backward(const detail::BackwardContext& c, const Tensor& g) {
  const int64_t dim = c.args().dim;
  std::vector<Tensor> result;
  int64_t offset = 0;
  for (size_t i = 0; i < c.num_inputs(); ++i) {
    const Shape& shape = c.shape(i);
    const int64_t size =
        shape.size() > static_cast<size_t>(dim) ? shape[static_cast<size_t>(dim)] : 0;
    result.push_back(c.needs(i) ? g.narrow(dim, offset, size) : Tensor());
    offset += size;
  }
  return result;
}
// OpArgs::extra: the 1-d index, scattered back along the other dims of g.
std::vector<Tensor> index_select_backward(const detail::BackwardContext& c, const Tensor& g) {
  const int64_t dim = c.args().dim;
  Shape view(static_cast<size_t>(g.dim()), 1);
  view[static_cast<size_t>(dim)] = g.size(dim);
  const Tensor index = c.args().extra.at(0).reshape(view).expand(g.sizes());
  return {scatter_add(zeros(c.shape(0), g.options()), dim, index, g), Tensor()};
}
// OpArgs::extra: the index.
std::vector<Tensor> gather_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {scatter_add(zeros(c.shape(0), g.options()), c.args().dim, c.args().extra.at(0), g),
          Tensor()};
}
std::vector<Tensor> scatter_add_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g, Tensor(), c.needs(2) ? gather(g, c.args().dim, c.args().extra.at(0)) : Tensor()};
}

EMBER_OP(kCatOp, detail::define_op("cat", "CatBackward", detail::saves({}, false), cat_backward,
                                   detail::CastPolicy::kPromote,
                                   detail::uses_kernels({EMBER_KERNEL(copy)})));
EMBER_OP(kStackOp, detail::define_composite("stack", detail::CastPolicy::kPromote));
EMBER_OP(kIndexSelectOp,
         detail::define_op("index_select", "IndexSelectBackward", detail::saves({}, false),
                           index_select_backward, detail::kNoAutocast,
                           detail::uses_kernels({EMBER_KERNEL(index_select)})));
EMBER_OP(kGatherOp,
         detail::define_op("gather", "GatherBackward", detail::saves({}, false), gather_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(gather)})));
EMBER_OP(kScatterAddOp,
         detail::define_op("scatter_add", "ScatterAddBackward", detail::saves({}, false),
                           scatter_add_backward, detail::CastPolicy::kPromote,
                           detail::uses_kernels({EMBER_KERNEL(scatter_add)})));

// The index as contiguous i64, after checking every value lies in [0, size). The range
// check runs here, on every device, so kernels never see a bad index.
Tensor checked_index(const Tensor& index, int64_t size, int64_t dim, const char* op) {
  EMBER_CHECK(index.dtype() == kI64 || index.dtype() == kI32, op, "index must be i64 or i32, got ",
              index.dtype());
  Tensor idx = index.to(kI64).contiguous();
  if (idx.numel() == 0) return idx;
  const int64_t lo = ember::min(idx).item<int64_t>();
  EMBER_CHECK(lo >= 0, op, "index ", lo, " is out of range for dim ", dim, " with size ", size);
  const int64_t hi = ember::max(idx).item<int64_t>();
  EMBER_CHECK(hi < size, op, "index ", hi, " is out of range for dim ", dim, " with size ", size);
  return idx;
}

// Checks shared by gather and scatter_add: same number of dims, and an index no larger
// than `t` outside `dim` (and no larger than `src`, when given, in any dim).
void check_index_shape(const Tensor& t, int64_t dim, const Tensor& index, const Tensor* src,
                       const char* op) {
  EMBER_CHECK(index.dim() == t.dim(), op, "index has ", index.dim(), " dims but input has ",
              t.dim(), " (shapes ", shape_str(index.sizes()), " and ", shape_str(t.sizes()), ")");
  for (int64_t d = 0; d < t.dim(); ++d) {
    EMBER_CHECK(d == dim || index.size(d) <= t.size(d), op, "index of shape ",
                shape_str(index.sizes()), " is larger than input of shape ", shape_str(t.sizes()),
                " in dim ", d);
  }
  if (src == nullptr) return;
  EMBER_CHECK(src->dim() == t.dim(), op, "src has ", src->dim(), " dims but input has ", t.dim());
  for (int64_t d = 0; d < t.dim(); ++d) {
    EMBER_CHECK(index.size(d) <= src->size(d), op, "index of shape ", shape_str(index.sizes()),
                " is larger than src of shape ", shape_str(src->sizes()), " in dim ", d);
  }
}

// A 0-d tensor as the 1-d tensor of its one value (a view), for ops that index dim 0.
Tensor at_least_1d(const Tensor& t) { return t.dim() == 0 ? t.reshape({1}) : t; }

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (auto out = detail::autocast(kCatOp, tensors, [&](const auto& x) { return cat(x, dim); }))
    return *out;
  EMBER_CHECK(!tensors.empty(), "cat", "expected a non-empty list of tensors");
  // Legacy rule kept by PyTorch: 1-d empty tensors may join tensors of any shape.
  const auto skipped = [](const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; };
  size_t ref = 0;
  DType dtype = kBool;  // the bottom of the promotion order
  for (size_t i = 0; i < tensors.size(); ++i) {
    detail::check_defined(tensors[i], "cat", "tensor");
    EMBER_CHECK(tensors[i].dim() > 0, "cat", "zero-dimensional tensor (at position ", i,
                ") cannot be concatenated");
    EMBER_CHECK(tensors[i].device() == tensors[0].device(), "cat", "tensor ", i, " is on ",
                tensors[i].device().str(), " but tensor 0 is on ", tensors[0].device().str());
    dtype = promote_types(dtype, tensors[i].dtype());
    if (skipped(tensors[ref]) && !skipped(tensors[i])) ref = i;
  }
  const Tensor& first = tensors[ref];
  const int64_t d = detail::wrap_dim(dim, first.dim(), "cat");
  Shape shape = first.sizes();
  shape[static_cast<size_t>(d)] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (skipped(t) && !skipped(first)) continue;
    EMBER_CHECK(t.dim() == first.dim(), "cat", "tensor ", i, " has ", t.dim(), " dims but tensor ",
                ref, " has ", first.dim(), " (shapes ", shape_str(t.sizes()), " and ",
                shape_str(first.sizes()), ")");
    for (int64_t e = 0; e < t.dim(); ++e) {
      EMBER_CHECK(e == d || t.size(e) == first.size(e), "cat", "sizes must match except in dim ", d,
                  ", but tensor ", i, " has shape ", shape_str(t.sizes()), " and tensor ", ref,
                  " has ", shape_str(first.sizes()));
    }
    shape[static_cast<size_t>(d)] += t.size(d);
  }
  detail::AutogradScope scope(kCatOp, tensors);
  Tensor out = empty(shape, TensorOptions(dtype, first.device()));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (skipped(t) && !skipped(first)) continue;
    if (t.numel() > 0) out.narrow(d, offset, t.size(d)).copy_(t);
    offset += t.size(d);
  }
  detail::OpArgs args;
  args.dim = d;
  return scope.finish(out, std::move(args));
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  if (auto out = detail::autocast(kStackOp, tensors, [&](const auto& x) { return stack(x, dim); }))
    return *out;
  EMBER_CHECK(!tensors.empty(), "stack", "expected a non-empty list of tensors");
  detail::check_defined(tensors[0], "stack", "tensor");
  const int64_t d = detail::wrap_dim(dim, tensors[0].dim() + 1, "stack");
  std::vector<Tensor> expanded;
  expanded.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    detail::check_defined(tensors[i], "stack", "tensor");
    EMBER_CHECK(tensors[i].sizes() == tensors[0].sizes(), "stack", "tensor ", i, " has shape ",
                shape_str(tensors[i].sizes()), " but tensor 0 has ", shape_str(tensors[0].sizes()));
    expanded.push_back(tensors[i].unsqueeze(d));
  }
  return cat(expanded, d);
}

Tensor index_select(const Tensor& t, int64_t dim, const Tensor& index) {
  detail::check_defined(t, "index_select");
  detail::check_defined(index, "index_select", "index");
  detail::check_same_device({&t, &index}, "index_select");
  EMBER_CHECK(index.dim() <= 1, "index_select", "index must be 1-d, got shape ",
              shape_str(index.sizes()));
  const int64_t d = detail::wrap_dim(dim, t.dim(), "index_select");
  detail::AutogradScope scope(kIndexSelectOp, {&t, &index});
  const Tensor in = at_least_1d(t).contiguous();
  const Tensor idx = checked_index(index, in.size(d), d, "index_select");
  int64_t outer = 1, inner = 1;
  for (int64_t e = 0; e < d; ++e) outer *= in.size(e);
  for (int64_t e = d + 1; e < in.dim(); ++e) inner *= in.size(e);
  Shape shape = in.sizes();
  shape[static_cast<size_t>(d)] = idx.numel();
  Tensor out = empty(shape, t.options());
  if (out.numel() > 0) {
    const auto& kernels = detail::kernels_for(t.device(), "index_select");
    detail::require_kernel(kernels.index_select, t.device(), "index_select")(out, in, idx, outer,
                                                                             in.size(d), inner);
  }
  detail::OpArgs args;
  args.dim = d;
  if (scope.recording()) args.extra = {idx};
  // A 0-d input keeps the index's shape: a 0-d index gives a 0-d result.
  return scope.finish(t.dim() == 0 ? out.view(index.sizes()) : out, std::move(args));
}

Tensor gather(const Tensor& t, int64_t dim, const Tensor& index) {
  detail::check_defined(t, "gather");
  detail::check_defined(index, "gather", "index");
  detail::check_same_device({&t, &index}, "gather");
  const int64_t d = detail::wrap_dim(dim, t.dim(), "gather");
  check_index_shape(t, d, index, nullptr, "gather");
  detail::AutogradScope scope(kGatherOp, {&t, &index});
  const Tensor in = at_least_1d(t).contiguous();
  const Tensor idx = at_least_1d(checked_index(index, in.size(d), d, "gather"));
  Tensor out = empty(idx.sizes(), t.options());
  if (out.numel() > 0) {
    const auto& kernels = detail::kernels_for(t.device(), "gather");
    detail::require_kernel(kernels.gather, t.device(), "gather")(out, in, d, idx);
  }
  detail::OpArgs args;
  args.dim = d;
  if (scope.recording()) args.extra = {index};
  return scope.finish(out.view(index.sizes()), std::move(args));
}

Tensor& Tensor::scatter_add_(int64_t dim, const Tensor& index, const Tensor& src) {
  detail::check_defined(*this, "scatter_add", "self");
  detail::check_defined(index, "scatter_add", "index");
  detail::check_defined(src, "scatter_add", "src");
  detail::check_same_device({this, &index, &src}, "scatter_add");
  detail::check_inplace("scatter_add_", *this, {&src});
  EMBER_CHECK(src.dtype() == dtype(), "scatter_add", "src has dtype ", src.dtype(),
              " but self has ", dtype());
  const int64_t d = detail::wrap_dim(dim, this->dim(), "scatter_add");
  check_index_shape(*this, d, index, &src, "scatter_add");
  const Tensor idx =
      at_least_1d(checked_index(index, at_least_1d(*this).size(d), d, "scatter_add"));
  if (idx.numel() == 0) return *this;
  // Only the part of src the index covers takes part.
  Tensor values = at_least_1d(src);
  for (int64_t e = 0; e < idx.dim(); ++e) values = values.narrow(e, 0, idx.size(e));
  values = values.contiguous();
  const auto& kernels = detail::kernels_for(device(), "scatter_add");
  const auto kernel = detail::require_kernel(kernels.scatter_add, device(), "scatter_add");
  if (is_contiguous()) {
    kernel(at_least_1d(*this), d, idx, values);
    storage().bump_version();
  } else {
    const Tensor dense = contiguous();
    kernel(dense, d, idx, values);
    copy_(dense);
  }
  return *this;
}

Tensor scatter_add(const Tensor& t, int64_t dim, const Tensor& index, const Tensor& src) {
  if (auto out = detail::autocast(kScatterAddOp, {&t, &index, &src}, [&](const auto& x) {
        return scatter_add(x[0], dim, x[1], x[2]);
      }))
    return *out;
  detail::check_defined(t, "scatter_add");
  detail::AutogradScope scope(kScatterAddOp, {&t, &index, &src});
  Tensor out = t.clone();
  out.scatter_add_(dim, index, src);
  detail::OpArgs args;
  args.dim = detail::wrap_dim(dim, t.dim(), "scatter_add");
  if (scope.recording()) args.extra = {index};
  return scope.finish(out, std::move(args));
}

Tensor one_hot(const Tensor& index, int64_t num_classes) {
  detail::check_defined(index, "one_hot", "index");
  EMBER_CHECK(is_integral(index.dtype()), "one_hot", "index must be an integer tensor, got ",
              index.dtype());
  EMBER_CHECK(num_classes >= -1, "one_hot", "num_classes must be -1 (infer) or non-negative, got ",
              num_classes);
  const Tensor idx = index.to(kI64);
  if (idx.numel() > 0) {
    const int64_t lo = ember::min(idx).item<int64_t>();
    EMBER_CHECK(lo >= 0, "one_hot", "class values must be non-negative, got ", lo);
  }
  if (num_classes == -1) {
    EMBER_CHECK(idx.numel() > 0, "one_hot",
                "cannot infer the number of classes from an empty index of shape ",
                shape_str(index.sizes()), "; pass num_classes");
    num_classes = ember::max(idx).item<int64_t>() + 1;
  } else if (idx.numel() > 0) {
    const int64_t hi = ember::max(idx).item<int64_t>();
    EMBER_CHECK(hi < num_classes, "one_hot", "class value ", hi,
                " is out of range for num_classes ", num_classes);
  }
  Shape shape = index.sizes();
  shape.push_back(num_classes);
  Tensor out = zeros(shape, TensorOptions(kI64, index.device()));
  if (idx.numel() == 0) return out;
  Shape ones_shape = index.sizes();
  ones_shape.push_back(1);
  out.scatter_add_(-1, idx.unsqueeze(-1), ones(ones_shape, TensorOptions(kI64, index.device())));
  return out;
}

namespace {

void check_mask(const Tensor& t, const Tensor& mask, const char* op) {
  detail::check_defined(t, op);
  detail::check_defined(mask, op, "mask");
  detail::check_same_device({&t, &mask}, op);
  EMBER_CHECK(mask.dtype() == kBool, op, "mask must be bool, got ", mask.dtype());
}

}  // namespace

Tensor masked_fill(const Tensor& t, const Tensor& mask, Scalar value) {
  check_mask(t, mask, "masked_fill");
  broadcast_shapes(t.sizes(), mask.sizes(), "masked_fill");
  return where(mask, scalar_tensor(value, t.options()), t);
}

Tensor& Tensor::masked_fill_(const Tensor& mask, Scalar value) {
  check_mask(*this, mask, "masked_fill_");
  EMBER_CHECK(broadcast_shapes(sizes(), mask.sizes(), "masked_fill_") == sizes(), "masked_fill_",
              "mask of shape ", shape_str(mask.sizes()), " cannot broadcast to ",
              shape_str(sizes()));
  detail::check_inplace("masked_fill_", *this);
  copy_(where(mask, scalar_tensor(value, options()), *this));
  return *this;
}

}  // namespace ember

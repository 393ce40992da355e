// Front ends of the layer ops GPT-style models add: layer_norm and embedding (gelu sits with
// the elementwise ops). Argument checks, output shapes, autograd recording.
#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/layer_backward.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "layer_ops.h"
#include "ops.h"

namespace ember {

using detail::AutogradScope;
using detail::OpArgs;

// --- descriptors --------------------------------------------------------------------------

namespace {

// layer_norm's gradients in recorded ops (create_graph): the statistics recomputed from the
// input, in f32 or wider as the forward's, over the trailing normalized dims. Dtypes as the
// kernel's: the input's gradient in its dtype, the weight's and bias's in the weight's.
std::array<Tensor, 3> layer_norm_backward_recorded(const Tensor& g, const Tensor& input,
                                                   const Tensor& weight, const OpArgs& a,
                                                   std::array<bool, 3> needs) {
  const DType stat = a.extra.at(1).dtype();
  const int64_t k = static_cast<int64_t>(a.dims.size()), lead = input.dim() - k;
  Shape dims, lead_dims;
  for (int64_t d = 0; d < input.dim(); ++d) (d < lead ? lead_dims : dims).push_back(d);
  const Tensor x = input.to(stat), gy = g.to(stat);
  const detail::Normalized n = detail::normalize_recorded(x, dims, a.a);
  // Over the leading dims to the normalized shape (none: the value itself).
  auto sum_lead = [&](const Tensor& t) {
    const DType param = weight.defined() ? weight.dtype() : input.dtype();
    return (lead_dims.empty() ? t : sum(t, lead_dims)).to(param);
  };
  std::array<Tensor, 3> grads;
  if (needs[0]) {
    const Tensor gxhat = weight.defined() ? gy * weight.to(stat) : gy;
    grads[0] = detail::normalize_backward_recorded(gxhat, n, dims).to(input.dtype());
  }
  if (needs[1] && weight.defined()) grads[1] = sum_lead(gy * n.xhat);
  if (needs[2]) grads[2] = sum_lead(gy);
  return grads;
}

// OpArgs::extra: mean, rstd; dims: the normalized shape; a: eps. The fused kernel, or recorded
// ops when the backward itself is recorded.
std::vector<Tensor> layer_norm_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  const OpArgs& a = c.args();
  const std::array<bool, 3> needs{c.needs(0), c.needs(1), c.needs(2)};
  const auto grads = detail::grad_needed({&g, &c.in(0), &c.in(1)})
                         ? layer_norm_backward_recorded(g, c.in(0), c.in(1), a, needs)
                         : detail::layer_norm_backward(g, c.in(0), c.in(1), a.extra.at(0),
                                                       a.extra.at(1), a.dims, needs);
  return {grads[0], grads[1], grads[2]};
}
// OpArgs::extra: the flat i64 indices; start: padding_idx (-1: none). The gradient is written
// in recorded ops (a masked scatter_add), so its own gradient picks rows again.
std::vector<Tensor> embedding_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  return {Tensor(),
          detail::embedding_backward(g, c.args().extra.at(0), c.shape(1)[0], c.args().start)};
}

// layer_norm in f32 (PyTorch's CUDA list); embedding is on none.
EMBER_OP(kLayerNormOp,
         detail::define_op("layer_norm", "LayerNormBackward", detail::saves({0, 1}, false),
                           layer_norm_backward_formula, detail::CastPolicy::kFloat32,
                           detail::uses_kernels({EMBER_KERNEL(layer_norm_forward),
                                                 EMBER_KERNEL(layer_norm_backward)})));
EMBER_OP(kEmbeddingOp, detail::define_op("embedding", "EmbeddingBackward", detail::saves({}, false),
                                         embedding_backward_formula, detail::kNoAutocast,
                                         detail::uses_kernels({EMBER_KERNEL(index_select)})));

}  // namespace

Tensor layer_norm(const Tensor& input, const Shape& normalized_shape, const Tensor& weight,
                  const Tensor& bias, double eps) {
  if (auto out = detail::autocast(kLayerNormOp, {&input, &weight, &bias}, [&](const auto& x) {
        return layer_norm(x[0], normalized_shape, x[1], x[2], eps);
      }))
    return *out;
  const char* op = "layer_norm";
  detail::check_defined(input, op);
  EMBER_CHECK(input.is_floating_point(), op, "expected a floating input, got ", input.dtype());
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  EMBER_CHECK(k >= 1, op, "normalized_shape must have at least one dim");
  bool matches = input.dim() >= k;
  for (int64_t i = 0; matches && i < k; ++i)
    matches = input.size(input.dim() - k + i) == normalized_shape[static_cast<size_t>(i)];
  EMBER_CHECK(matches, op, "normalized_shape ", shape_str(normalized_shape),
              " does not match the trailing dims of input ", shape_str(input.sizes()));
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, {&bias, "bias"}}) {
    if (!t->defined()) continue;
    EMBER_CHECK(t->sizes() == normalized_shape, op, name, " of shape ", shape_str(t->sizes()),
                " does not match normalized_shape ", shape_str(normalized_shape));
    EMBER_CHECK(t->dtype() == input.dtype(), op, name, " has dtype ", t->dtype(), " but input has ",
                input.dtype());
    EMBER_CHECK(t->device() == input.device(), op, name, " is on ", t->device().str(),
                " but input is on ", input.device().str());
  }
  EMBER_CHECK(eps >= 0, op, "eps must be non-negative, got ", eps);

  AutogradScope scope(kLayerNormOp, {&input, &weight, &bias});
  int64_t n = 1;
  for (int64_t s : normalized_shape) n *= s;
  const int64_t rows = n == 0 ? 0 : input.numel() / n;
  const DType stat_dtype = input.dtype() == kF16 || input.dtype() == kBF16 ? kF32 : input.dtype();
  const TensorOptions stat_options(stat_dtype, input.device());
  Tensor out = empty(input.sizes(), input.options());
  Tensor mean = empty({rows}, stat_options), rstd = empty({rows}, stat_options);
  if (out.numel() > 0) {
    detail::require_kernel(detail::kernels_for(input.device(), op).layer_norm_forward,
                           input.device(),
                           op)(out.view({rows, n}), mean, rstd, input.contiguous().view({rows, n}),
                               weight.defined() ? weight.contiguous().view({n}) : weight,
                               bias.defined() ? bias.contiguous().view({n}) : bias, eps);
  }
  OpArgs args;
  args.dims = normalized_shape;
  args.a = eps;
  if (scope.recording()) args.extra = {mean, rstd};
  return scope.finish(out, std::move(args));
}

Tensor embedding(const Tensor& indices, const Tensor& weight, std::optional<int64_t> padding_idx) {
  const char* op = "embedding";
  detail::check_defined(indices, op, "indices");
  detail::check_defined(weight, op, "weight");
  EMBER_CHECK(indices.dtype() == kI64 || indices.dtype() == kI32, op,
              "indices must be i64 or i32, got ", indices.dtype());
  EMBER_CHECK(weight.dim() == 2, op, "expected a 2-d weight [num_embeddings, dim], got shape ",
              shape_str(weight.sizes()));
  detail::check_same_device({&indices, &weight}, op);
  const int64_t num = weight.size(0), dim = weight.size(1);
  int64_t pad = -1;
  if (padding_idx) {
    EMBER_CHECK(*padding_idx >= -num && *padding_idx < num, op, "padding_idx ", *padding_idx,
                " is out of range for num_embeddings ", num);
    pad = *padding_idx < 0 ? *padding_idx + num : *padding_idx;
  }
  const Tensor idx = indices.to(kI64).contiguous().view({indices.numel()});
  if (idx.numel() > 0) {
    // The range check runs here, on every device, so the kernel never sees a bad index.
    const int64_t lo = ember::min(idx).item<int64_t>(), hi = ember::max(idx).item<int64_t>();
    const int64_t bad = lo < 0 ? lo : hi;
    EMBER_CHECK(lo >= 0 && hi < num, op, "index ", bad, " is out of range for num_embeddings ", num,
                " (weight ", shape_str(weight.sizes()), ")");
  }

  AutogradScope scope(kEmbeddingOp, {&indices, &weight});
  Shape shape = indices.sizes();
  shape.push_back(dim);
  Tensor out = empty({idx.numel(), dim}, weight.options());
  if (out.numel() > 0) {
    detail::require_kernel(detail::kernels_for(weight.device(), op).index_select, weight.device(),
                           op)(out, weight.contiguous(), idx, 1, num, dim);
  }
  OpArgs args;
  args.start = pad;
  if (scope.recording()) args.extra = {idx};
  return scope.finish(out.view(shape), std::move(args));
}

namespace detail {

std::array<Tensor, 3> layer_norm_backward(const Tensor& grad_out, const Tensor& input,
                                          const Tensor& weight, const Tensor& mean,
                                          const Tensor& rstd, const Shape& normalized_shape,
                                          std::array<bool, 3> needs) {
  const int64_t rows = mean.numel();
  const int64_t n = rows == 0 ? 0 : input.numel() / rows;
  // Without a weight the bias's gradient takes the input's dtype.
  const TensorOptions param_options = weight.defined() ? weight.options() : input.options();
  Tensor gi = needs[0] ? empty(input.sizes(), input.options()) : Tensor();
  Tensor gw = needs[1] && weight.defined() ? empty(normalized_shape, param_options) : Tensor();
  Tensor gb = needs[2] ? empty(normalized_shape, param_options) : Tensor();
  if (input.numel() == 0) {
    for (Tensor* t : {&gw, &gb})
      if (t->defined()) t->zero_();
    return {gi, gw, gb};
  }
  require_kernel(kernels_for(input.device(), "layer_norm").layer_norm_backward, input.device(),
                 "layer_norm")(
      gi.defined() ? gi.view({rows, n}) : gi, gw.defined() ? gw.view({n}) : gw,
      gb.defined() ? gb.view({n}) : gb, grad_out.contiguous().view({rows, n}),
      input.contiguous().view({rows, n}), weight.defined() ? weight.contiguous().view({n}) : weight,
      mean, rstd);
  return {gi, gw, gb};
}

Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t num_embeddings,
                          int64_t padding_idx) {
  const int64_t dim = grad_out.size(-1), count = indices.numel();
  Tensor g = grad_out.reshape({count, dim});
  if (padding_idx >= 0) g = where(eq(indices, padding_idx).unsqueeze(1), 0.0, g);
  return scatter_add(zeros({num_embeddings, dim}, grad_out.options()), 0,
                     indices.unsqueeze(1).expand({count, dim}), g);
}

}  // namespace detail

}  // namespace ember

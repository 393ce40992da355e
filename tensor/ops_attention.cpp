// Front end of scaled-dot-product attention: argument checks, the dropout draw, autograd.
#include "attention.h"

#include <cmath>

#include "detail/attention.h"
#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {

using detail::AttentionParams;

namespace {

// --- descriptors --------------------------------------------------------------------------

// q, k, v and the output saved; OpArgs::extra: the logsumexp; attention: the parameters.
std::vector<Tensor> attention_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  const auto grads = detail::scaled_dot_product_attention_backward(
      g, c.in(0), c.in(1), c.in(2), c.out(), c.args().extra.at(0), c.args().attention,
      {c.needs(0), c.needs(1), c.needs(2)});
  return {grads[0], grads[1], grads[2]};
}

// Low precision, as on PyTorch's CUDA list (its kernels accumulate in f32).
EMBER_OP(kAttentionOp,
         detail::define_op("scaled_dot_product_attention", "ScaledDotProductAttentionBackward",
                           detail::saves({0, 1, 2}, true), attention_backward_formula,
                           detail::CastPolicy::kLowerPrecision,
                           detail::uses_kernels({EMBER_KERNEL(attention_forward),
                                                 EMBER_KERNEL(attention_backward)}))
             .first_order());

constexpr const char* kOp = "scaled_dot_product_attention";

// t [..., L, X] as the contiguous [BH, L, X] the kernels take (BH: the leading dims).
Tensor rows_of(const Tensor& t) {
  int64_t rows = 1;
  for (int64_t d = 0; d < t.dim() - 2; ++d) rows *= t.size(d);
  return t.contiguous().view({rows, t.size(-2), t.size(-1)});
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  for (const auto& [t, name] : {std::pair{&q, "query"}, {&k, "key"}, {&v, "value"}}) {
    detail::check_defined(*t, kOp, name);
    EMBER_CHECK(t->is_floating_point(), kOp, "expected a floating ", name, ", got ", t->dtype());
    EMBER_CHECK(t->dim() >= 2, kOp, "expected ", name, " [..., L, E] with at least 2 dims, got ",
                shape_str(t->sizes()));
    EMBER_CHECK(t->dtype() == q.dtype(), kOp, name, " has dtype ", t->dtype(), " but query has ",
                q.dtype());
    EMBER_CHECK(t->device() == q.device(), kOp, name, " is on ", t->device().str(),
                " but query is on ", q.device().str());
  }
  const std::string shapes =
      detail::str_cat(" (query ", shape_str(q.sizes()), ", key ", shape_str(k.sizes()), ", value ",
                      shape_str(v.sizes()), ")");
  EMBER_CHECK(k.dim() == q.dim() && v.dim() == q.dim(), kOp,
              "query, key and value must have the same number of dims", shapes);
  for (int64_t d = 0; d < q.dim() - 2; ++d) {
    EMBER_CHECK(k.size(d) == q.size(d) && v.size(d) == q.size(d), kOp,
                "leading dims differ at dim ", d, shapes);
  }
  EMBER_CHECK(k.size(-1) == q.size(-1), kOp, "query has embedding size ", q.size(-1),
              " but key has ", k.size(-1), shapes);
  EMBER_CHECK(q.size(-1) > 0, kOp, "query and key have embedding size 0", shapes);
  EMBER_CHECK(v.size(-2) == k.size(-2), kOp, "key has ", k.size(-2), " positions but value has ",
              v.size(-2), shapes);
}

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& query, const Tensor& key, const Tensor& value,
                                    bool is_causal, double dropout_p, std::optional<double> scale,
                                    Generator* gen) {
  if (auto out = detail::autocast(kAttentionOp, {&query, &key, &value}, [&](const auto& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], is_causal, dropout_p, scale, gen);
      }))
    return *out;
  check_inputs(query, key, value);
  EMBER_CHECK(dropout_p >= 0.0 && dropout_p <= 1.0, kOp, "dropout_p must be in [0, 1], got ",
              dropout_p);
  EMBER_CHECK(!scale || std::isfinite(*scale), kOp, "scale must be finite, got ",
              scale ? *scale : 0.0);

  AttentionParams params;
  params.scale = scale ? *scale : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
  params.causal = is_causal;
  params.dropout_p = dropout_p;
  if (dropout_p > 0.0) {
    std::tie(params.seed, params.offset) =
        (gen != nullptr ? *gen : default_generator()).next_draw();
  }

  detail::AutogradScope scope(kAttentionOp, {&query, &key, &value});
  Shape out_shape = query.sizes();
  out_shape.back() = value.size(-1);
  Tensor out = empty(out_shape, query.options());
  const Tensor q = rows_of(query);
  const DType lse_dtype = query.dtype() == kF64 ? kF64 : kF32;
  Tensor lse = empty({q.size(0), q.size(1)}, TensorOptions(lse_dtype, query.device()));
  if (q.size(0) * q.size(1) > 0) {  // (E_v may be 0: the logsumexp is still filled)
    detail::require_kernel(detail::kernels_for(query.device(), kOp).attention_forward,
                           query.device(), kOp)(out.view({q.size(0), q.size(1), value.size(-1)}),
                                                lse, q, rows_of(key), rows_of(value), params);
  }
  detail::OpArgs args;
  args.attention = params;
  if (scope.recording()) args.extra = {lse};
  return scope.finish(out, std::move(args));
}

namespace detail {

std::array<Tensor, 3> scaled_dot_product_attention_backward(const Tensor& grad_out, const Tensor& q,
                                                            const Tensor& k, const Tensor& v,
                                                            const Tensor& out, const Tensor& lse,
                                                            const AttentionParams& params,
                                                            std::array<bool, 3> needs) {
  const Tensor q3 = rows_of(q), k3 = rows_of(k), v3 = rows_of(v);
  Tensor gq = empty(q3.sizes(), q3.options());
  Tensor gk = empty(k3.sizes(), k3.options());
  Tensor gv = empty(v3.sizes(), v3.options());
  if (q3.size(0) > 0) {
    require_kernel(kernels_for(q.device(), kOp).attention_backward, q.device(), kOp)(
        gq, gk, gv, rows_of(grad_out), q3, k3, v3, rows_of(out), lse, params);
  }
  return {needs[0] ? gq.view(q.sizes()) : Tensor(), needs[1] ? gk.view(k.sizes()) : Tensor(),
          needs[2] ? gv.view(v.sizes()) : Tensor()};
}

}  // namespace detail

}  // namespace ember

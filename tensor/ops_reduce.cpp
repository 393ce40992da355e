// Reductions: sum, mean, max/min (+ indices), argmax/argmin, var/std, norm.
#include <algorithm>
#include <cmath>
#include <limits>

#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {
namespace {

using detail::AutogradScope;
using detail::OpArgs;
using detail::ReduceOp;

// --- descriptors --------------------------------------------------------------------------

// OpArgs::dims, keepdim: the reduced dims.
std::vector<Tensor> sum_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {detail::expand_reduced(g, c.shape(0), c.args().dims, c.args().keepdim)};
}
std::vector<Tensor> mean_backward(const detail::BackwardContext& c, const Tensor& g) {
  const detail::OpArgs& a = c.args();
  int64_t n = 1;
  const auto dims = detail::wrap_dims(a.dims, static_cast<int64_t>(c.shape(0).size()), "backward");
  for (int64_t d : dims) n *= c.shape(0)[static_cast<size_t>(d)];
  return {detail::expand_reduced(g, c.shape(0), a.dims, a.keepdim) / static_cast<double>(n)};
}
// Ties share the gradient evenly.
std::vector<Tensor> extreme_all_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Tensor hits = eq(c.in(0), c.out()).to(g.dtype());
  return {hits * (g / sum(hits))};
}
// OpArgs::extra: the indices; dim, keepdim.
std::vector<Tensor> extreme_dim_backward(const detail::BackwardContext& c, const Tensor& g) {
  const detail::OpArgs& a = c.args();
  Tensor indices = a.extra.at(0), gk = g;
  if (!a.keepdim && !c.shape(0).empty()) {
    indices = indices.unsqueeze(a.dim);
    gk = gk.unsqueeze(a.dim);
  }
  return {scatter_add(zeros(c.shape(0), g.options()), a.dim, indices, gk)};
}
// OpArgs::correction.
std::vector<Tensor> var_backward(const detail::BackwardContext& c, const Tensor& g) {
  const detail::OpArgs& a = c.args();
  const Tensor& x = c.in(0);
  int64_t n = 1;
  const auto dims = detail::wrap_dims(a.dims, x.dim(), "backward");
  for (int64_t d : dims) n *= x.size(d);
  const Tensor centered = x - mean(x, a.dims, true);
  return {detail::expand_reduced(g, c.shape(0), a.dims, a.keepdim) * centered *
          (2.0 / static_cast<double>(std::max<int64_t>(n - a.correction, 0)))};
}
// OpArgs::a: p.
std::vector<Tensor> norm_backward(const detail::BackwardContext& c, const Tensor& g) {
  const detail::OpArgs& a = c.args();
  const Tensor& x = c.in(0);
  const Tensor norm_k = detail::expand_reduced(c.out(), c.shape(0), a.dims, a.keepdim);
  const Tensor gk = detail::expand_reduced(g, c.shape(0), a.dims, a.keepdim);
  const double p = a.a;
  if (std::isinf(p)) {
    const Tensor hits = eq(abs(x), norm_k).to(g.dtype());
    const Tensor count =
        detail::expand_reduced(sum(hits, a.dims, a.keepdim), c.shape(0), a.dims, a.keepdim);
    return {gk * detail::sign_of(x) * hits / count};
  }
  if (p == 1.0) return {gk * detail::sign_of(x)};
  // x |x|^(p-2) / norm^(p-1); zero where the norm is zero.
  const Tensor scale = p == 2.0 ? x / norm_k : x * pow(abs(x), p - 2.0) / pow(norm_k, p - 1.0);
  return {where(eq(norm_k, 0), 0.0, gk * scale)};
}

EMBER_OP(kSumOp, detail::define_op("sum", "SumBackward", detail::saves({}, false), sum_backward,
                                   detail::CastPolicy::kFloat32,
                                   detail::uses_kernels({EMBER_KERNEL(reduce)})));
EMBER_OP(kMeanOp,
         detail::define_op("mean", "MeanBackward", detail::saves({}, false), mean_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(reduce)})));
EMBER_OP(kMaxAllOp,
         detail::define_op("max", "MaxBackward", detail::saves({0}, true), extreme_all_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(reduce)})));
EMBER_OP(kMinAllOp,
         detail::define_op("min", "MinBackward", detail::saves({0}, true), extreme_all_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(reduce)})));
EMBER_OP(kMaxDimOp, detail::define_op("max.dim", "MaxDimBackward", detail::saves({}, false),
                                      extreme_dim_backward, detail::kNoAutocast,
                                      detail::uses_kernels({EMBER_KERNEL(arg_reduce)})));
EMBER_OP(kMinDimOp, detail::define_op("min.dim", "MinDimBackward", detail::saves({}, false),
                                      extreme_dim_backward, detail::kNoAutocast,
                                      detail::uses_kernels({EMBER_KERNEL(arg_reduce)})));
EMBER_OP(kVarOp,
         detail::define_op("var", "VarBackward", detail::saves({0}, false), var_backward,
                           detail::kNoAutocast, detail::uses_kernels({EMBER_KERNEL(reduce)})));
EMBER_OP(kNormOp, detail::define_op("norm", "NormBackward", detail::saves({0}, true), norm_backward,
                                    detail::CastPolicy::kFloat32,
                                    detail::uses_kernels({EMBER_KERNEL(reduce)})));

OpArgs reduce_args(const Shape& dims, bool keepdim) {
  OpArgs args;
  args.dims = dims;
  args.keepdim = keepdim;
  return args;
}

// A tensor laid out for the reduce kernels: contiguous [outer, r] with the reduced dims
// innermost, and the shape the result takes.
struct ReducePlan {
  Tensor in;
  int64_t outer = 1;
  int64_t r = 1;
  Shape out_shape;
};

ReducePlan plan_reduce(const Tensor& t, const Shape& dims, bool keepdim, const char* op) {
  ReducePlan plan;
  const int64_t ndim = t.dim();
  if (ndim == 0) {
    for (const int64_t d : dims) detail::wrap_dim(d, 0, op);
    plan.in = t.contiguous();
    return plan;
  }
  const std::vector<int64_t> reduced = detail::wrap_dims(dims, ndim, op);
  std::vector<bool> is_reduced(static_cast<size_t>(ndim), false);
  for (const int64_t d : reduced) is_reduced[static_cast<size_t>(d)] = true;
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t size = t.size(d);
    if (is_reduced[static_cast<size_t>(d)]) {
      plan.r *= size;
      if (keepdim) plan.out_shape.push_back(1);
    } else {
      plan.outer *= size;
      plan.out_shape.push_back(size);
    }
  }
  plan.in = detail::move_dims_last(t, reduced);
  return plan;
}

Tensor run_reduce(ReduceOp op, const ReducePlan& plan, DType dtype, const char* name,
                  double p = 0.0, int64_t correction = 0) {
  Tensor out = empty(plan.out_shape, TensorOptions(dtype, plan.in.device()));
  if (out.numel() == 0) return out;
  const auto& kernels = detail::kernels_for(plan.in.device(), name);
  detail::require_kernel(kernels.reduce, plan.in.device(), name)(op, out, plan.in, plan.outer,
                                                                 plan.r, p, correction);
  return out;
}

void check_floating(const Tensor& t, const char* op) {
  EMBER_CHECK(t.is_floating_point(), op, "expected a floating dtype, got ", t.dtype(),
              " (convert with .to(kF32) first)");
}

// max/min of all elements.
Tensor extreme_all(const Tensor& t, bool is_max, const char* op) {
  detail::check_defined(t, op);
  EMBER_CHECK(t.numel() > 0, op, "cannot reduce an empty tensor of shape ", shape_str(t.sizes()),
              ": the ", op, " of no elements is undefined");
  return run_reduce(is_max ? ReduceOp::kMax : ReduceOp::kMin, plan_reduce(t, {}, false, op),
                    t.dtype(), op);
}

// Values and indices of the max/min along one dim (dim empty: of the flattened tensor).
std::tuple<Tensor, Tensor> arg_extreme(const Tensor& t, std::optional<int64_t> dim, bool keepdim,
                                       bool is_max, const char* op) {
  detail::check_defined(t, op);
  ReducePlan plan;
  if (dim) {
    const int64_t d = detail::wrap_dim(*dim, t.dim(), op);
    if (t.dim() > 0 && t.size(d) == 0) {
      // An empty reduced dim is an error unless the result is empty too (as in PyTorch).
      int64_t rest = 1;
      for (int64_t e = 0; e < t.dim(); ++e) rest *= e == d ? 1 : t.size(e);
      EMBER_CHECK(rest == 0, op, "cannot reduce dim ", *dim, " of size 0 (shape ",
                  shape_str(t.sizes()), ")");
    }
    plan = plan_reduce(t, t.dim() == 0 ? Shape{} : Shape{d}, keepdim, op);
  } else {
    EMBER_CHECK(t.numel() > 0, op, "cannot reduce an empty tensor of shape ", shape_str(t.sizes()));
    plan = plan_reduce(t, {}, keepdim, op);
  }
  Tensor values = empty(plan.out_shape, t.options());
  Tensor indices = empty(plan.out_shape, TensorOptions(kI64, t.device()));
  if (values.numel() == 0) return {values, indices};
  const auto& kernels = detail::kernels_for(t.device(), op);
  detail::require_kernel(kernels.arg_reduce, t.device(), op)(is_max, values, indices, plan.in,
                                                             plan.outer, plan.r);
  return {values, indices};
}

}  // namespace

Tensor sum(const Tensor& t, const Shape& dims, bool keepdim) {
  if (auto out =
          detail::autocast(kSumOp, {&t}, [&](const auto& x) { return sum(x[0], dims, keepdim); }))
    return *out;
  detail::check_defined(t, "sum");
  AutogradScope scope(kSumOp, {&t});
  // Integer and bool sums accumulate and return i64, as in PyTorch.
  const Tensor in = is_floating(t.dtype()) ? t : t.to(kI64);
  return scope.finish(
      run_reduce(ReduceOp::kSum, plan_reduce(in, dims, keepdim, "sum"), in.dtype(), "sum"),
      reduce_args(dims, keepdim));
}

Tensor mean(const Tensor& t, const Shape& dims, bool keepdim) {
  detail::check_defined(t, "mean");
  check_floating(t, "mean");
  AutogradScope scope(kMeanOp, {&t});
  return scope.finish(
      run_reduce(ReduceOp::kMean, plan_reduce(t, dims, keepdim, "mean"), t.dtype(), "mean"),
      reduce_args(dims, keepdim));
}

Tensor max(const Tensor& t) {
  AutogradScope scope(kMaxAllOp, {&t});
  return scope.finish(extreme_all(t, true, "max"));
}
Tensor min(const Tensor& t) {
  AutogradScope scope(kMinAllOp, {&t});
  return scope.finish(extreme_all(t, false, "min"));
}

namespace {
// max/min along a dim: the values carry gradients to the positions the indices name.
std::tuple<Tensor, Tensor> extreme_dim(const Tensor& t, int64_t dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "max" : "min";
  AutogradScope scope(is_max ? kMaxDimOp : kMinDimOp, {&t});
  auto [values, indices] = arg_extreme(t, dim, keepdim, is_max, op);
  OpArgs args = reduce_args({}, keepdim);
  if (scope.recording()) {
    args.dim = detail::wrap_dim(dim, t.dim(), op);
    args.extra = {indices};
  }
  const Tensor outputs[] = {values, indices};
  scope.finish_all(outputs, std::move(args));
  return {values, indices};
}
}  // namespace

std::tuple<Tensor, Tensor> max(const Tensor& t, int64_t dim, bool keepdim) {
  return extreme_dim(t, dim, keepdim, true);
}
std::tuple<Tensor, Tensor> min(const Tensor& t, int64_t dim, bool keepdim) {
  return extreme_dim(t, dim, keepdim, false);
}

Tensor argmax(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  return std::get<1>(arg_extreme(t, dim, keepdim, true, "argmax"));
}
Tensor argmin(const Tensor& t, std::optional<int64_t> dim, bool keepdim) {
  return std::get<1>(arg_extreme(t, dim, keepdim, false, "argmin"));
}

Tensor var(const Tensor& t, const Shape& dims, int64_t correction, bool keepdim) {
  detail::check_defined(t, "var");
  check_floating(t, "var");
  EMBER_CHECK(correction >= 0, "var", "correction must be non-negative, got ", correction);
  AutogradScope scope(kVarOp, {&t});
  OpArgs args = reduce_args(dims, keepdim);
  args.correction = correction;
  return scope.finish(run_reduce(ReduceOp::kVar, plan_reduce(t, dims, keepdim, "var"), t.dtype(),
                                 "var", 0.0, correction),
                      std::move(args));
}

Tensor std(const Tensor& t, const Shape& dims, int64_t correction, bool keepdim) {
  detail::check_defined(t, "std");
  check_floating(t, "std");
  EMBER_CHECK(correction >= 0, "std", "correction must be non-negative, got ", correction);
  return sqrt(var(t, dims, correction, keepdim));
}

Tensor norm(const Tensor& t, double p, const Shape& dims, bool keepdim) {
  if (auto out = detail::autocast(kNormOp, {&t},
                                  [&](const auto& x) { return norm(x[0], p, dims, keepdim); }))
    return *out;
  detail::check_defined(t, "norm");
  check_floating(t, "norm");
  EMBER_CHECK(p > 0 && !std::isnan(p), "norm", "p must be positive (or infinity), got ", p);
  AutogradScope scope(kNormOp, {&t});
  OpArgs args = reduce_args(dims, keepdim);
  args.a = p;
  return scope.finish(
      run_reduce(ReduceOp::kNorm, plan_reduce(t, dims, keepdim, "norm"), t.dtype(), "norm", p),
      std::move(args));
}

Tensor Tensor::sum(const Shape& dims, bool keepdim) const {
  return ember::sum(*this, dims, keepdim);
}
Tensor Tensor::mean(const Shape& dims, bool keepdim) const {
  return ember::mean(*this, dims, keepdim);
}
Tensor Tensor::max() const { return ember::max(*this); }
Tensor Tensor::min() const { return ember::min(*this); }
Tensor Tensor::argmax(std::optional<int64_t> dim, bool keepdim) const {
  return ember::argmax(*this, dim, keepdim);
}

}  // namespace ember

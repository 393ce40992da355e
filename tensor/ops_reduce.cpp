// Reductions: sum, mean, max/min (+ indices), argmax/argmin, var/std, norm.
#include <cmath>
#include <limits>

#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {
namespace {

using detail::AutogradScope;
using detail::OpArgs;
using detail::OpId;
using detail::ReduceOp;

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
  if (auto out = detail::autocast(detail::AutocastOp::kSum, {&t},
                                  [&](const auto& x) { return sum(x[0], dims, keepdim); }))
    return *out;
  detail::check_defined(t, "sum");
  AutogradScope scope(OpId::kSum, {&t});
  // Integer and bool sums accumulate and return i64, as in PyTorch.
  const Tensor in = is_floating(t.dtype()) ? t : t.to(kI64);
  return scope.finish(
      run_reduce(ReduceOp::kSum, plan_reduce(in, dims, keepdim, "sum"), in.dtype(), "sum"),
      reduce_args(dims, keepdim));
}

Tensor mean(const Tensor& t, const Shape& dims, bool keepdim) {
  detail::check_defined(t, "mean");
  check_floating(t, "mean");
  AutogradScope scope(OpId::kMean, {&t});
  return scope.finish(
      run_reduce(ReduceOp::kMean, plan_reduce(t, dims, keepdim, "mean"), t.dtype(), "mean"),
      reduce_args(dims, keepdim));
}

Tensor max(const Tensor& t) {
  AutogradScope scope(OpId::kMaxAll, {&t});
  return scope.finish(extreme_all(t, true, "max"));
}
Tensor min(const Tensor& t) {
  AutogradScope scope(OpId::kMinAll, {&t});
  return scope.finish(extreme_all(t, false, "min"));
}

namespace {
// max/min along a dim: the values carry gradients to the positions the indices name.
std::tuple<Tensor, Tensor> extreme_dim(const Tensor& t, int64_t dim, bool keepdim, bool is_max) {
  const char* op = is_max ? "max" : "min";
  AutogradScope scope(is_max ? OpId::kMaxDim : OpId::kMinDim, {&t});
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
  AutogradScope scope(OpId::kVar, {&t});
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
  if (auto out = detail::autocast(detail::AutocastOp::kNorm, {&t},
                                  [&](const auto& x) { return norm(x[0], p, dims, keepdim); }))
    return *out;
  detail::check_defined(t, "norm");
  check_floating(t, "norm");
  EMBER_CHECK(p > 0 && !std::isnan(p), "norm", "p must be positive (or infinity), got ", p);
  AutogradScope scope(OpId::kNorm, {&t});
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

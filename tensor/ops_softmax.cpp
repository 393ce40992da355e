// softmax and log_softmax along one dim.
#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {
namespace {

// --- descriptors --------------------------------------------------------------------------

// OpArgs::dim: the softmax dim.
std::vector<Tensor> softmax_backward(const detail::BackwardContext& c, const Tensor& g) {
  const Tensor& y = c.out();
  return {y * (g - sum(g * y, {c.args().dim}, true))};
}
std::vector<Tensor> log_softmax_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {g - exp(c.out()) * sum(g, {c.args().dim}, true)};
}

EMBER_OP(kSoftmaxOp, detail::define_op("softmax", "SoftmaxBackward", detail::saves({}, true),
                                       softmax_backward, detail::CastPolicy::kFloat32,
                                       detail::uses_kernels({EMBER_KERNEL(softmax)})));
EMBER_OP(kLogSoftmaxOp,
         detail::define_op("log_softmax", "LogSoftmaxBackward", detail::saves({}, true),
                           log_softmax_backward, detail::CastPolicy::kFloat32,
                           detail::uses_kernels({EMBER_KERNEL(softmax)})));

Tensor softmax_impl(const Tensor& t, int64_t dim, bool log, const char* op) {
  detail::check_defined(t, op);
  EMBER_CHECK(t.is_floating_point(), op, "expected a floating dtype, got ", t.dtype(),
              " (convert with .to(kF32) first)");
  const int64_t d = detail::wrap_dim(dim, t.dim(), op);
  // A 0-d tensor is one row of one value.
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t e = 0; e < t.dim(); ++e) {
    if (e < d)
      outer *= t.size(e);
    else if (e == d)
      n = t.size(e);
    else
      inner *= t.size(e);
  }
  detail::AutogradScope scope(log ? kLogSoftmaxOp : kSoftmaxOp, {&t});
  const Tensor in = t.contiguous();
  Tensor out = empty(t.sizes(), t.options());
  if (out.numel() > 0) {
    const auto& kernels = detail::kernels_for(t.device(), op);
    detail::require_kernel(kernels.softmax, t.device(), op)(out, in, outer, n, inner, log);
  }
  detail::OpArgs args;
  args.dim = d;
  return scope.finish(out, std::move(args));
}

}  // namespace

Tensor softmax(const Tensor& t, int64_t dim) {
  if (auto out =
          detail::autocast(kSoftmaxOp, {&t}, [&](const auto& x) { return softmax(x[0], dim); }))
    return *out;
  return softmax_impl(t, dim, false, "softmax");
}
Tensor log_softmax(const Tensor& t, int64_t dim) {
  if (auto out = detail::autocast(kLogSoftmaxOp, {&t},
                                  [&](const auto& x) { return log_softmax(x[0], dim); }))
    return *out;
  return softmax_impl(t, dim, true, "log_softmax");
}

Tensor Tensor::softmax(int64_t dim) const { return ember::softmax(*this, dim); }
Tensor Tensor::log_softmax(int64_t dim) const { return ember::log_softmax(*this, dim); }

}  // namespace ember

// silu (torch.nn.functional.silu): its front end, descriptor and gradient.
#include "detail/autograd_hooks.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "detail/silu.h"
#include "layer_ops.h"
#include "ops.h"

namespace ember {
namespace {

constexpr const char* kOp = "silu";

// t dense in the layout PyTorch's silu keeps (a channels_last input stays channels_last). The
// kernels walk memory in order, so input, gradient and output share this one layout.
Tensor dense(const Tensor& t) { return t.contiguous(t.suggest_memory_format()); }

// grad * silu'(x): the fused kernel, or (when the backward itself is recorded, create_graph)
// the same formula in differentiable ops.
Tensor silu_backward(const Tensor& grad, const Tensor& x) {
  if (GradMode::is_enabled()) {
    const Tensor s = sigmoid(x);
    return grad * (s * (1.0 + x * (1.0 - s)));
  }
  const Tensor in = dense(x);
  const Tensor g = grad.to(x.dtype()).contiguous(in.suggest_memory_format());
  Tensor grad_in = empty_like(in);
  if (grad_in.numel() > 0) {
    detail::require_kernel(detail::silu_backward_kernels.get(x.device().type), x.device(), kOp)(
        grad_in, g, in);
  }
  return grad_in;
}

std::vector<Tensor> silu_backward_formula(const detail::BackwardContext& c, const Tensor& g) {
  return {silu_backward(g, c.in(0))};
}

// On no autocast list, as in PyTorch: it runs in its input's dtype.
EMBER_OP(kSiluOp, detail::define_op(
                      "silu", "SiluBackward", detail::saves({0}, false), silu_backward_formula,
                      detail::kNoAutocast,
                      detail::uses_kernels({EMBER_OWN_KERNEL(detail::silu_forward_kernels),
                                            EMBER_OWN_KERNEL(detail::silu_backward_kernels)})));

}  // namespace

Tensor silu(const Tensor& input) {
  detail::check_defined(input, kOp);
  EMBER_CHECK(input.is_floating_point(), kOp, "expected a floating input, got ", input.dtype());
  detail::AutogradScope scope(kSiluOp, {&input});
  const Tensor in = dense(input);
  Tensor out = empty_like(in);
  if (out.numel() > 0) {
    detail::require_kernel(detail::silu_forward_kernels.get(input.device().type), input.device(),
                           kOp)(out, in);
  }
  return scope.finish(out);
}

}  // namespace ember

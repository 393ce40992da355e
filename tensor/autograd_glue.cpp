// The Tensor methods that belong to autograd, and the hook table autograd/ fills in.
#include <atomic>

#include "detail/autograd_hooks.h"
#include "ops.h"

namespace ember {

namespace detail {

namespace {
std::atomic<const AutogradHooks*> registered_hooks{nullptr};
}

const AutogradHooks* autograd_hooks() { return registered_hooks.load(std::memory_order_acquire); }
void set_autograd_hooks(const AutogradHooks* hooks) {
  registered_hooks.store(hooks, std::memory_order_release);
}

const AutogradHooks& require_autograd(const char* op) {
  const AutogradHooks* hooks = autograd_hooks();
  EMBER_CHECK(hooks != nullptr, op,
              "autograd is not linked in: link ember::ember (or ember_autograd) and ",
              "include <ember/autograd/autograd.h>");
  return *hooks;
}

bool grad_needed(std::initializer_list<const Tensor*> inputs) {
  if (!GradMode::is_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

void check_inplace(const char* op, const Tensor& self,
                   std::initializer_list<const Tensor*> others) {
  if (!GradMode::is_enabled() || !self.defined()) return;
  EMBER_CHECK(!self.requires_grad(), op,
              "a tensor that requires grad cannot be modified in place while ",
              "recording; use the out-of-place form, or run the update under NoGradGuard");
  for (const Tensor* t : others) {
    EMBER_CHECK(t == nullptr || !t->defined() || !t->requires_grad(), op,
                "an in-place op cannot take an ",
                "operand that requires grad while recording; use the out-of-place form");
  }
}

AutogradScope::AutogradScope(const OpDef& op, std::initializer_list<const Tensor*> inputs)
    : op_(op), previous_mode_(GradMode::is_enabled()), recording_(grad_needed(inputs)) {
  if (recording_) {
    require_autograd("autograd");
    for (const Tensor* t : inputs) inputs_.push_back(t != nullptr ? *t : Tensor());
  }
  GradMode::set_enabled(false);
}

AutogradScope::AutogradScope(const OpDef& op, const std::vector<Tensor>& inputs)
    : op_(op), previous_mode_(GradMode::is_enabled()), recording_(false) {
  if (previous_mode_) {
    for (const Tensor& t : inputs) recording_ = recording_ || (t.defined() && t.requires_grad());
  }
  if (recording_) {
    require_autograd("autograd");
    inputs_ = inputs;
  }
  GradMode::set_enabled(false);
}

Tensor AutogradScope::finish(Tensor output, OpArgs&& args) {
  finish_all(std::span<const Tensor>(&output, 1), std::move(args));
  return output;
}

void AutogradScope::finish_all(std::span<const Tensor> outputs, OpArgs&& args) {
  GradMode::set_enabled(previous_mode_);
  if (recording_) autograd_hooks()->record(op_, inputs_, outputs, std::move(args));
}

}  // namespace detail

bool Tensor::requires_grad() const {
  const AutogradMeta* meta = impl().autograd.get();
  return meta != nullptr && meta->requires_grad;
}

AutogradMeta& Tensor::ensure_autograd_meta() const {
  Impl& i = impl();
  if (!i.autograd) i.autograd = std::make_shared<AutogradMeta>();
  return *i.autograd;
}

std::weak_ptr<AutogradMeta> Tensor::weak_autograd_meta() const {
  ensure_autograd_meta();
  return impl().autograd;
}

Tensor& Tensor::requires_grad_(bool requires_grad) {
  EMBER_CHECK(is_leaf(), "requires_grad_",
              "only leaf tensors can change requires_grad; use detach() to get a leaf");
  EMBER_CHECK(!requires_grad || is_floating_point(), "requires_grad_",
              "only floating tensors can require gradients, this one is ", dtype());
  if (requires_grad || autograd_meta() != nullptr)
    ensure_autograd_meta().requires_grad = requires_grad;
  return *this;
}

const Tensor& Tensor::grad() const {
  static const Tensor kUndefined;
  const AutogradMeta* meta = impl().autograd.get();
  return meta != nullptr ? meta->grad : kUndefined;
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    EMBER_CHECK(grad.sizes() == sizes() && grad.device() == device() && grad.dtype() == dtype(),
                "set_grad", "gradient of shape ", shape_str(grad.sizes()), " (", grad.dtype(), ", ",
                grad.device().str(), ") does not match tensor of shape ", shape_str(sizes()), " (",
                dtype(), ", ", device().str(), ")");
  }
  if (grad.defined() || autograd_meta() != nullptr) {
    AutogradMeta& meta = ensure_autograd_meta();
    meta.grad = grad;
    if (grad.defined()) meta.grad_held_by_rank = -1;
  }
}

bool Tensor::is_leaf() const {
  const AutogradMeta* meta = impl().autograd.get();
  return meta == nullptr || meta->grad_fn == nullptr;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  const AutogradMeta* meta = impl().autograd.get();
  return meta != nullptr ? meta->grad_fn : kNone;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph, bool create_graph) const {
  EMBER_CHECK(requires_grad(), "backward", "tensor does not require grad and has no grad_fn");
  if (!gradient.defined()) {
    EMBER_CHECK(numel() == 1, "backward",
                "grad can be implicitly created only for one-element outputs, this one ",
                "has shape ", shape_str(sizes()));
  } else {
    EMBER_CHECK(gradient.sizes() == sizes(), "backward", "gradient of shape ",
                shape_str(gradient.sizes()), " does not match output of shape ",
                shape_str(sizes()));
  }
  detail::require_autograd("backward").backward(*this, gradient, retain_graph, create_graph);
}

void Tensor::retain_grad() const {
  EMBER_CHECK(requires_grad(), "retain_grad", "called on a tensor that doesn't require grad");
  if (is_leaf()) return;  // leaves keep their gradient anyway
  detail::require_autograd("retain_grad").retain_grad(*this);
}

void Tensor::register_hook(std::function<Tensor(const Tensor&)> hook) const {
  EMBER_CHECK(requires_grad(), "register_hook",
              "cannot register a hook on a tensor that doesn't require grad");
  detail::require_autograd("register_hook").register_hook(*this, std::move(hook));
}

void Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) const {
  EMBER_CHECK(
      requires_grad() && is_leaf(), "register_post_accumulate_grad_hook",
      "post-accumulate-grad hooks can only be registered on leaf tensors that require grad");
  ensure_autograd_meta().post_accumulate_hooks.push_back(std::move(hook));
}

}  // namespace ember

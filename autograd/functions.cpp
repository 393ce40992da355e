// The recording that attaches a backward node to an op's outputs; the node runs the backward
// formula of the op's descriptor (tensor/detail/op_def.h, defined in the op's own file).
#include <ember/tensor/detail/autograd_hooks.h>

#include "engine.h"
#include "node.h"

namespace ember::autograd {

using detail::OpArgs;
using detail::OpDef;

namespace {

struct InputInfo {
  Shape sizes;
  DType dtype = kF32;
  Device device;
  bool needs_grad = false;
};

// A node's context whose saved output has its history (a create_graph backward).
class WithOutputHistory final : public detail::BackwardContext {
 public:
  WithOutputHistory(const detail::BackwardContext& node, Tensor output)
      : node_(node), output_(std::move(output)) {}
  const Tensor& in(size_t i) const override { return node_.in(i); }
  const Tensor& out() const override { return output_; }
  bool needs(size_t i) const override { return node_.needs(i); }
  const Shape& shape(size_t i) const override { return node_.shape(i); }
  size_t num_inputs() const override { return node_.num_inputs(); }
  const OpArgs& args() const override { return node_.args(); }

 private:
  const detail::BackwardContext& node_;
  Tensor output_;
};

// A recorded op: the tensors its descriptor's save plan names, and its backward run through
// the BackwardContext the formula reads.
class OpNode final : public Node, private detail::BackwardContext {
 public:
  OpNode(const OpDef& op, uint32_t num_outputs, OpArgs&& args)
      : Node(num_outputs), op_(op), args_(std::move(args)) {}

  std::string name() const override { return std::string(op_.node_name); }

  void release_saved() override {
    // As in PyTorch, only a backward that needs freed tensors is an error: a node that saved
    // nothing (a cast, an add) stays usable. Autocast's cached weight casts rely on it.
    bool saved = saved_output_.defined() || !args_.extra.empty();
    for (auto& s : saved_inputs_) {
      saved = saved || s.defined();
      s.reset();
    }
    saved_output_.reset();
    for (auto& t : args_.extra) t = Tensor();
    released_ = released_ || saved;
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    EMBER_CHECK(!released_, "backward", "trying to backward through the graph a second time (",
                name(),
                "'s saved tensors were freed); pass retain_graph=true to the first backward");
    // Under create_graph, the saved output takes this node as its history again (PyTorch's
    // saved outputs do the same), so a formula reading it (exp's, softmax's) records its
    // dependence on the inputs. Only the formula's context holds it: kept by the node, it
    // would be a cycle.
    const bool recording = GradMode::is_enabled();
    const detail::BackwardContext& context = *this;
    std::vector<Tensor> result;
    if (recording && saved_output_.defined()) {
      const WithOutputHistory with_output(
          context, with_history(saved_output_.unpack(op_.node_name.data()), shared_from_this(), 0));
      result = op_.backward(with_output, grads[0]);
    } else {
      result = op_.backward(context, grads[0]);
    }
    result.resize(inputs_.size());
    for (size_t i = 0; i < result.size(); ++i) {
      Tensor& g = result[i];
      if (!g.defined() || !inputs_[i].needs_grad) {
        g = Tensor();
        continue;
      }
      if (g.dtype() != inputs_[i].dtype || g.device() != inputs_[i].device) {
        g = g.to(inputs_[i].device, inputs_[i].dtype);
      }
      EMBER_ASSERT(g.sizes() == inputs_[i].sizes, name(), " produced a gradient of shape ",
                   shape_str(g.sizes()), " for input ", i, " of shape ",
                   shape_str(inputs_[i].sizes));
      if (recording && !op_.twice_differentiable) {
        g = first_order_gradient(g, op_.name, *this, grads);
      }
    }
    return result;
  }

  void save(std::span<const Tensor> inputs, std::span<const Tensor> outputs) {
    saved_inputs_.resize(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (op_.save.saves_input(i)) saved_inputs_[i] = SavedTensor(inputs[i]);
    // Outputs are saved without their history: a node holding its own output would form a cycle.
    if (op_.save.output) saved_output_ = SavedTensor(outputs[0].detach());
    for (const Tensor& t : inputs) {
      InputInfo info;
      if (t.defined()) info = InputInfo{t.sizes(), t.dtype(), t.device(), t.requires_grad()};
      inputs_.push_back(std::move(info));
    }
  }

 private:
  // detail::BackwardContext (node names come from string literals, so data() ends in a NUL)
  const Tensor& in(size_t i) const override {
    return saved_inputs_[i].unpack(op_.node_name.data());
  }
  const Tensor& out() const override { return saved_output_.unpack(op_.node_name.data()); }
  // A gradient nobody asked for is not computed (autograd::grad's pass runs only toward its
  // inputs).
  bool needs(size_t i) const override { return inputs_[i].needs_grad && edge_needed(i); }
  const Shape& shape(size_t i) const override { return inputs_[i].sizes; }
  size_t num_inputs() const override { return inputs_.size(); }
  const OpArgs& args() const override { return args_; }

  const OpDef& op_;
  OpArgs args_;
  std::vector<SavedTensor> saved_inputs_;
  SavedTensor saved_output_;
  std::vector<InputInfo> inputs_;
  bool released_ = false;
};

void record(const OpDef& op, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
            OpArgs&& args) {
  auto node = std::make_shared<OpNode>(op, static_cast<uint32_t>(outputs.size()), std::move(args));
  node->save(inputs, outputs);
  for (const Tensor& t : inputs) node->add_next_edge(gradient_edge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    if (!out.defined() || !out.is_floating_point()) continue;
    AutogradMeta& meta = out.ensure_autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
  }
}

void backward_hook(const Tensor& root, const Tensor& gradient, bool retain_graph,
                   bool create_graph) {
  backward({root}, {gradient}, retain_graph, create_graph);
}

void register_hook(const Tensor& t, std::function<Tensor(const Tensor&)> hook) {
  if (t.is_leaf()) {
    t.ensure_autograd_meta().grad_hooks.push_back(std::move(hook));
  } else {
    t.grad_fn()->add_pre_hook(t.autograd_meta()->output_nr, std::move(hook));
  }
}

void retain_grad(const Tensor& t) {
  std::weak_ptr<AutogradMeta> weak = t.weak_autograd_meta();
  t.grad_fn()->add_retain_grad_hook(t.autograd_meta()->output_nr, [weak](const Tensor& g) {
    if (auto meta = weak.lock()) meta->grad = meta->grad.defined() ? meta->grad + g : g.clone();
    return Tensor();
  });
}

const detail::AutogradHooks kHooks{record, backward_hook, register_hook, retain_grad};

}  // namespace

bool register_autograd() {
  detail::set_autograd_hooks(&kHooks);
  return true;
}

}  // namespace ember::autograd

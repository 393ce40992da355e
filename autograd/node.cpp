#include "node.h"

#include <atomic>

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

namespace ember::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}

Node::Node(uint32_t num_inputs)
    : num_inputs_(num_inputs),
      sequence_nr_(next_sequence_nr++),
      trace_scope_(trace::enabled() ? trace::current_scope() : 0) {}

void Node::add_pre_hook(uint32_t input_nr, std::function<Tensor(const Tensor&)> hook) {
  pre_hooks_.emplace_back(input_nr, std::move(hook));
}

void Node::add_retain_grad_hook(uint32_t input_nr, std::function<Tensor(const Tensor&)> hook) {
  retain_grad_hooks_.emplace_back(input_nr, std::move(hook));
}

void Node::run_pre_hooks(std::vector<Tensor>& grads) const {
  for (const auto* hooks : {&pre_hooks_, &retain_grad_hooks_}) {
    for (const auto& [input_nr, hook] : *hooks) {
      if (!grads[input_nr].defined()) continue;
      Tensor replaced = hook(grads[input_nr]);
      if (replaced.defined()) grads[input_nr] = std::move(replaced);
    }
  }
}

const NodeFilter*& current_node_filter() {
  thread_local const NodeFilter* filter = nullptr;
  return filter;
}

bool Node::edge_needed(size_t i) const {
  const NodeFilter* filter = current_node_filter();
  if (filter == nullptr) return true;
  return i < next_edges_.size() && next_edges_[i].valid() && (*filter)(next_edges_[i].node.get());
}

const Tensor& SavedTensor::unpack(const char* node) const {
  EMBER_CHECK(!released_, "backward", "trying to backward through the graph a second time (", node,
              "'s saved tensors were freed); pass retain_graph=true to the first backward");
  EMBER_CHECK(!tensor_.defined() || tensor_.storage().version() == version_, "backward",
              "a tensor saved by ", node, " (shape ", shape_str(tensor_.sizes()),
              ") was modified by an in-place ", "operation after it was saved (version ", version_,
              " -> ", tensor_.storage().version(), ")");
  return tensor_;
}

AccumulateGrad::AccumulateGrad(Tensor leaf) : Node(1), leaf_(std::move(leaf)) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor g = std::move(grads[0]);
  AutogradMeta& meta = leaf_.ensure_autograd_meta();
  meta.grad_held_by_rank = -1;
  for (const auto& hook : meta.grad_hooks) {
    Tensor replaced = hook(g);
    if (replaced.defined()) g = std::move(replaced);
  }
  if (g.dtype() != leaf_.dtype() || g.device() != leaf_.device())
    g = g.to(leaf_.device(), leaf_.dtype());
  if (!meta.grad.defined()) {
    // Steal a gradient nothing else refers to; copy one that is shared or oddly laid out.
    // The gradient takes the leaf's memory format (PyTorch's layout contract).
    const MemoryFormat format = leaf_.suggest_memory_format();
    const bool owned =
        g.storage().use_count() == 1 && g.is_contiguous(format) && g.sizes() == leaf_.sizes();
    meta.grad = owned && !GradMode::is_enabled() ? g : g.expand(leaf_.sizes()).clone(format);
  } else if (GradMode::is_enabled()) {
    meta.grad = meta.grad + g;  // create_graph: keep the accumulation differentiable
  } else {
    meta.grad.add_(g);
  }
  for (const auto& hook : meta.post_accumulate_hooks) hook(leaf_);
  return {};
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.ensure_autograd_meta();
  if (meta.grad_fn) return Edge{meta.grad_fn, meta.output_nr};
  std::shared_ptr<Node> accumulator = meta.grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(t);
    meta.grad_accumulator = accumulator;
  }
  return Edge{accumulator, 0};
}

Tensor with_history(const Tensor& t, std::shared_ptr<Node> node, uint32_t output_nr) {
  Tensor out = t.detach();
  AutogradMeta& meta = out.ensure_autograd_meta();
  meta.requires_grad = true;
  meta.grad_fn = std::move(node);
  meta.output_nr = output_nr;
  return out;
}

namespace {
class FirstOrderGradient final : public Node {
 public:
  FirstOrderGradient(std::string_view op, std::string node_name)
      : Node(1), op_(op), node_name_(std::move(node_name)) {}
  std::string name() const override { return node_name_ + "Backward"; }
  std::vector<Tensor> apply(std::vector<Tensor>&&) override {
    throw Error(detail::str_cat(op_, ": its gradient has no derivative in ember (a first-order ",
                                "backward); a backward through a gradient taken with ",
                                "create_graph=true cannot pass ", node_name_));
  }

 private:
  std::string op_, node_name_;
};
}  // namespace

Tensor first_order_gradient(const Tensor& g, std::string_view op, const Node& backward,
                            const std::vector<Tensor>& grads) {
  auto node = std::make_shared<FirstOrderGradient>(op, backward.name());
  for (const Tensor& in : grads) node->add_next_edge(gradient_edge(in));
  for (const Edge& edge : backward.next_edges()) node->add_next_edge(edge);
  return with_history(g, std::move(node), 0);
}

}  // namespace ember::autograd

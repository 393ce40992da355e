#include "engine.h"

#include <queue>
#include <unordered_map>

#include <ember/tensor/detail/autocast_policy.h>
#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

#include "node.h"

namespace ember::autograd {

namespace {

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

// A node's run recorded as an op event, and added to its module's span. A leaf's
// AccumulateGrad counts for no module: it is made once and kept across passes, and its hooks
// (DDP's) do communication, not the module's backward.
std::vector<Tensor> traced_apply(Node& node, std::vector<Tensor>&& grads,
                                 trace::BackwardSpans& spans) {
  const int64_t start = trace::now_ns();
  std::vector<Tensor> outputs = node.apply(std::move(grads));
  const int64_t end = trace::now_ns();
  trace::record(trace::Category::kOp, node.name(), start, end);
  if (dynamic_cast<AccumulateGrad*>(&node) == nullptr) spans.add(node.trace_scope(), start, end);
  return outputs;
}

// The callbacks of the backward pass running on this thread (null outside one); a backward
// run inside a hook has its own.
thread_local std::vector<std::function<void()>>* pass_callbacks = nullptr;

struct CallbackScope {
  std::vector<std::function<void()>> callbacks;
  std::vector<std::function<void()>>* outer = pass_callbacks;
  CallbackScope() { pass_callbacks = &callbacks; }
  ~CallbackScope() { pass_callbacks = outer; }
  CallbackScope(const CallbackScope&) = delete;
  CallbackScope& operator=(const CallbackScope&) = delete;
  void run() {
    // By index: a callback may queue another.
    for (size_t i = 0; i < callbacks.size(); ++i) {
      std::function<void()> callback = std::move(callbacks[i]);
      callback();
    }
  }
};

}  // namespace

void queue_callback(std::function<void()> callback) {
  EMBER_CHECK(pass_callbacks != nullptr, "queue_callback",
              "callbacks can only be queued during a backward pass (from a hook or a node)");
  pass_callbacks->push_back(std::move(callback));
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
              bool retain_graph, bool create_graph) {
  EMBER_CHECK(gradients.empty() || gradients.size() == roots.size(), "backward", "got ",
              gradients.size(), " gradients for ", roots.size(), " outputs");
  // A graph built by create_graph refers back to this one, so it has to stay (as in PyTorch).
  retain_graph = retain_graph || create_graph;
  const trace::Range pass(trace::Category::kAutograd, "backward");
  trace::BackwardSpans spans;
  CallbackScope callbacks;
  GradModeGuard mode(create_graph);
  // Backward formulas run in the dtypes their forward ops ran in, as in PyTorch: a
  // backward() called inside an AutocastGuard does not recast them.
  const detail::AutocastSuspend no_cpu_autocast(DeviceType::kCPU);
  const detail::AutocastSuspend no_cuda_autocast(DeviceType::kCUDA);

  // Seed the input buffers of the roots' nodes.
  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  auto deliver = [&buffers](const Edge& edge, const Tensor& grad) {
    std::vector<Tensor>& buffer = buffers[edge.node.get()];
    if (buffer.empty()) buffer.resize(edge.node->num_inputs());
    Tensor& slot = buffer[edge.input_nr];
    slot = slot.defined() ? slot + grad : grad;
  };
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& root = roots[i];
    EMBER_CHECK(root.defined() && root.requires_grad(), "backward", "output ", i,
                " does not require grad and has no grad_fn");
    Tensor grad = gradients.empty() ? Tensor() : gradients[i];
    if (!grad.defined()) {
      EMBER_CHECK(root.numel() == 1, "backward",
                  "grad can be implicitly created only for one-element outputs, ", "output ", i,
                  " has shape ", shape_str(root.sizes()));
      grad = ones_like(root);
    }
    const Edge edge = gradient_edge(root);
    deliver(edge, grad);
    root_nodes.push_back(edge.node);
  }

  // Count, for every node reachable from the roots, how many edges lead into it.
  std::unordered_map<Node*, int> dependencies;
  {
    std::vector<Node*> stack;
    std::unordered_map<Node*, bool> seen;
    for (const auto& node : root_nodes) {
      if (!seen[node.get()]) {
        seen[node.get()] = true;
        stack.push_back(node.get());
      }
    }
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& edge : node->next_edges()) {
        if (!edge.valid()) continue;
        ++dependencies[edge.node.get()];
        if (!seen[edge.node.get()]) {
          seen[edge.node.get()] = true;
          stack.push_back(edge.node.get());
        }
      }
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (const auto& node : root_nodes) {
    if (dependencies[node.get()] == 0) {
      dependencies[node.get()] = -1;  // queued once even if it is several roots' node
      ready.push(node.get());
    }
  }
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[node]);
    buffers.erase(node);
    grads.resize(node->num_inputs());
    node->run_pre_hooks(grads);
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    std::vector<Tensor> outputs;
    if (any && trace::enabled()) {
      outputs = traced_apply(*node, std::move(grads), spans);
    } else if (any) {
      outputs = node->apply(std::move(grads));
    }
    if (!retain_graph) node->release_saved();
    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& edge = edges[i];
      if (!edge.valid()) continue;
      if (i < outputs.size() && outputs[i].defined()) deliver(edge, outputs[i]);
      if (--dependencies[edge.node.get()] == 0) ready.push(edge.node.get());
    }
  }
  callbacks.run();
  spans.finish();
}

}  // namespace ember::autograd

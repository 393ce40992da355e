#include "engine.h"

#include <algorithm>
#include <optional>
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

namespace {

// What grad() asks of a pass: the gradients arriving at these (node, input slot) pairs are
// captured instead of accumulated, and only nodes on a path to one of them run.
struct Capture {
  std::unordered_map<Node*, std::vector<std::pair<uint32_t, size_t>>> slots;  // -> result index
  std::vector<Tensor> results;
};

// Whether a capture target is reachable from each node of the graph below `roots` (a node's
// own targets included), walked without recursion: graphs can be thousands of nodes deep.
std::unordered_map<Node*, bool> reaching_a_target(const std::vector<std::shared_ptr<Node>>& roots,
                                                  const Capture& capture) {
  std::unordered_map<Node*, bool> reaches;
  std::vector<std::pair<Node*, size_t>> stack;  // node, next edge to visit
  for (const auto& root : roots) {
    if (reaches.count(root.get())) continue;
    reaches[root.get()] = capture.slots.count(root.get()) > 0;
    stack.emplace_back(root.get(), 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const auto& edges = node->next_edges();
      if (next < edges.size()) {
        Node* child = edges[next++].node.get();
        if (child == nullptr) continue;
        auto [it, fresh] = reaches.try_emplace(child, capture.slots.count(child) > 0);
        if (fresh) {
          stack.emplace_back(child, 0);
        } else if (it->second) {
          reaches[node] = true;
        }
        continue;
      }
      const bool found = reaches[node];
      stack.pop_back();
      if (found && !stack.empty()) reaches[stack.back().first] = true;
    }
  }
  return reaches;
}

// Runs a backward pass from `roots`: into the leaves' grad() (backward), or into `capture`.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
                  bool retain_graph, bool create_graph, Capture* capture) {
  const char* op = capture != nullptr ? "grad" : "backward";
  EMBER_CHECK(gradients.empty() || gradients.size() == roots.size(), op, "got ", gradients.size(),
              " gradients for ", roots.size(), " outputs");
  // A graph built by create_graph refers back to this one, so it has to stay (as in PyTorch).
  retain_graph = retain_graph || create_graph;
  const trace::Range pass(trace::Category::kAutograd, op);
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
    EMBER_CHECK(root.defined() && root.requires_grad(), op, "output ", i,
                " does not require grad and has no grad_fn");
    Tensor grad = gradients.empty() ? Tensor() : gradients[i];
    if (!grad.defined()) {
      EMBER_CHECK(root.numel() == 1, op, "grad can be implicitly created only for one-element ",
                  "outputs, output ", i, " has shape ", shape_str(root.sizes()));
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
  // Under capture, gradients go only where they lead towards a target: a node runs only if
  // one of its edges does, computes only those edges' gradients (Node::edge_needed), and
  // nothing is delivered into a branch that leads nowhere (its hooks never see a gradient).
  std::unordered_map<Node*, bool> reaches;
  if (capture != nullptr) reaches = reaching_a_target(root_nodes, *capture);
  const NodeFilter toward_a_target = [&reaches](const Node* node) {
    const auto it = reaches.find(const_cast<Node*>(node));
    return it != reaches.end() && it->second;
  };
  const NodeFilter* outer_filter = current_node_filter();
  current_node_filter() = capture != nullptr ? &toward_a_target : nullptr;
  struct RestoreFilter {
    const NodeFilter* outer;
    ~RestoreFilter() { current_node_filter() = outer; }
  } restore{outer_filter};
  auto leads_to_a_target = [&toward_a_target](const Node& node) {
    for (const Edge& edge : node.next_edges()) {
      if (edge.valid() && toward_a_target(edge.node.get())) return true;
    }
    return false;
  };

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
    bool run = true;
    if (capture != nullptr) {
      if (const auto it = capture->slots.find(node); it != capture->slots.end()) {
        for (const auto& [slot, index] : it->second) capture->results[index] = grads[slot];
      }
      run = leads_to_a_target(*node);
    }
    bool any = false;
    for (const Tensor& g : grads) any = any || g.defined();
    std::vector<Tensor> outputs;
    if (run && any && trace::enabled()) {
      outputs = traced_apply(*node, std::move(grads), spans);
    } else if (run && any) {
      outputs = node->apply(std::move(grads));
    }
    if (!retain_graph && run) node->release_saved();
    const auto& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& edge = edges[i];
      if (!edge.valid()) continue;
      const bool wanted = capture == nullptr || toward_a_target(edge.node.get());
      if (i < outputs.size() && outputs[i].defined() && wanted) deliver(edge, outputs[i]);
      if (--dependencies[edge.node.get()] == 0) ready.push(edge.node.get());
    }
  }
  callbacks.run();
  spans.finish();
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients,
              bool retain_graph, bool create_graph) {
  run_backward(roots, gradients, retain_graph, create_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, std::optional<bool> retain_graph,
                         bool create_graph, bool allow_unused) {
  Capture capture;
  capture.results.resize(inputs.size());
  std::vector<Edge> edges;
  for (size_t i = 0; i < inputs.size(); ++i) {
    EMBER_CHECK(inputs[i].defined() && inputs[i].requires_grad(), "grad", "input ", i,
                " does not require grad");
    edges.push_back(gradient_edge(inputs[i]));
    capture.slots[edges.back().node.get()].emplace_back(edges.back().input_nr, i);
  }
  run_backward(outputs, grad_outputs, retain_graph.value_or(create_graph), create_graph, &capture);
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor& g = capture.results[i];
    // An input listed again takes the first one's gradient (its hooks run once).
    const auto listed = edges.begin() + static_cast<ptrdiff_t>(i);
    const auto first = std::find_if(edges.begin(), listed, [&](const Edge& e) {
      return e.node == listed->node && e.input_nr == listed->input_nr;
    });
    if (first != listed) {
      g = capture.results[static_cast<size_t>(first - edges.begin())];
      continue;
    }
    if (!g.defined()) {
      EMBER_CHECK(allow_unused, "grad", "input ", i, " (shape ", shape_str(inputs[i].sizes()),
                  ") was not used in the graph of the outputs; pass allow_unused=true to get an ",
                  "undefined gradient for it");
      continue;
    }
    // A leaf's own gradient hooks see its gradient, as they would before accumulating.
    if (const auto* accumulator = dynamic_cast<const AccumulateGrad*>(edges[i].node.get())) {
      for (const auto& hook : accumulator->leaf().ensure_autograd_meta().grad_hooks) {
        Tensor replaced = hook(g);
        if (replaced.defined()) g = std::move(replaced);
      }
    }
    if (g.sizes() != inputs[i].sizes()) g = g.expand(inputs[i].sizes()).clone();
  }
  return std::move(capture.results);
}

}  // namespace ember::autograd

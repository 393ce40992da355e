// The autograd graph: a Node per recorded op, with edges to the nodes of its inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ember/tensor/tensor.h>
#include <ember/tensor/trace.h>

namespace ember::autograd {

class Node;

// Where a gradient goes: input slot `input_nr` of `node` (a null node drops it).
struct Edge {
  std::shared_ptr<Node> node;
  uint32_t input_nr = 0;
  bool valid() const { return node != nullptr; }
};

// A backward function. It receives one gradient per output of the forward op (its "inputs"
// here; undefined where no gradient flowed) and returns one per forward input, in the order
// of next_edges().
class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(uint32_t num_inputs);
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  virtual std::string name() const = 0;
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // Drops saved tensors once a backward pass without retain_graph is done with them.
  virtual void release_saved() {}

  uint32_t num_inputs() const { return num_inputs_; }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  void add_next_edge(Edge edge) { next_edges_.push_back(std::move(edge)); }
  // Creation order: later nodes run first among those that are ready.
  uint64_t sequence_nr() const { return sequence_nr_; }
  // The module scope the node was created in while a trace recorded (0: none), so a
  // backward pass can time each module (trace::BackwardSpans).
  uint32_t trace_scope() const { return trace_scope_; }

  // Hooks that see (and may replace) the gradient arriving at input `input_nr`.
  void add_pre_hook(uint32_t input_nr, std::function<Tensor(const Tensor&)> hook);
  // retain_grad's hook: it runs after the others, so it sees the gradient they produce.
  void add_retain_grad_hook(uint32_t input_nr, std::function<Tensor(const Tensor&)> hook);
  void run_pre_hooks(std::vector<Tensor>& grads) const;
  // Whether the pass running on this thread wants the gradient for next edge i: always in
  // backward(); in autograd::grad's, only along edges that lead to one of its inputs.
  bool edge_needed(size_t i) const;

 private:
  uint32_t num_inputs_;
  uint64_t sequence_nr_;
  uint32_t trace_scope_;
  std::vector<Edge> next_edges_;
  std::vector<std::pair<uint32_t, std::function<Tensor(const Tensor&)>>> pre_hooks_;
  std::vector<std::pair<uint32_t, std::function<Tensor(const Tensor&)>>> retain_grad_hooks_;
};

// A tensor kept for backward, with the version it had, so that an in-place change made
// since is reported instead of silently giving wrong gradients.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t)
      : tensor_(t), version_(t.defined() ? t.storage().version() : 0) {}
  // The tensor; ember::Error naming `node` if it was modified in place or released.
  const Tensor& unpack(const char* node) const;
  void reset() {
    tensor_ = Tensor();
    released_ = true;
  }
  bool defined() const { return tensor_.defined(); }

 private:
  Tensor tensor_;
  uint64_t version_ = 0;
  bool released_ = false;
};

// The sink of a leaf's gradients: sums them into leaf.grad(), then runs its
// post-accumulate hooks (the moment the leaf's gradient is complete for this pass).
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor leaf);
  std::string name() const override { return "AccumulateGrad"; }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  const Tensor& leaf() const { return leaf_; }

 private:
  Tensor leaf_;
};

// The edge a gradient for `t` flows into: its grad_fn, its leaf accumulator, or none.
Edge gradient_edge(const Tensor& t);

// The nodes the pass running on this thread lets through (autograd::grad's; null: every node).
// Set by the engine for the length of a pass.
using NodeFilter = std::function<bool(const Node*)>;
const NodeFilter*& current_node_filter();

// `t`'s data as output `output_nr` of `node`: a tensor with that history.
Tensor with_history(const Tensor& t, std::shared_ptr<Node> node, uint32_t output_nr);

// A gradient that `backward`, the first-order node of `op`, computed under create_graph from
// `grads`, given a history that a second backward cannot pass: reaching it is an ember::Error
// naming the op (PyTorch's "derivative ... is not implemented"), never a silent zero. Its
// edges lead where the gradient depends on (the gradients in, the forward's inputs), so
// autograd::grad finds those inputs used and runs into the error too.
Tensor first_order_gradient(const Tensor& g, std::string_view op, const Node& backward,
                            const std::vector<Tensor>& grads);

}  // namespace ember::autograd

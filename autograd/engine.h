// Runs backward passes over the recorded graph.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::autograd {

// Back-propagates from `roots` with the given output gradients (undefined entries mean ones
// for one-element roots). Nodes run once all gradients for them have arrived, so every leaf
// accumulates exactly once per pass. Without retain_graph the saved tensors are freed and a
// second pass over the same graph is an error; with create_graph the backward computation
// is itself recorded (and the graph retained).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& gradients = {},
              bool retain_graph = false, bool create_graph = false);

// torch.autograd.grad: the gradients of `outputs` (weighted by `grad_outputs`; undefined
// entries mean ones for one-element outputs) with respect to `inputs`, returned instead of
// accumulated into anyone's grad(), running only the part of the graph between them. The
// graph is kept when retain_graph is true (default: create_graph), and the gradients carry
// history when create_graph is true, so they can be differentiated again (gradient penalties,
// Hessian-vector products). An input the outputs do not depend on is an ember::Error unless
// allow_unused, which gives it an undefined tensor.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {},
                         std::optional<bool> retain_graph = std::nullopt, bool create_graph = false,
                         bool allow_unused = false);

// Runs `callback` once the backward pass running on this thread has gone through its whole
// graph, before backward() returns (PyTorch's Variable._execution_engine.queue_callback): a
// hook that must see every gradient of the pass (DDP's wait for its all-reduces) queues its
// work here instead of doing it inside the last node. Callbacks run in the order queued, and
// may queue more. Outside a backward pass it is an ember::Error. A pass that fails drops them.
void queue_callback(std::function<void()> callback);

}  // namespace ember::autograd

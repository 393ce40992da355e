// Runs backward passes over the recorded graph.
#pragma once

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

}  // namespace ember::autograd

// Custom differentiable functions: a forward computed by any means (collectives, fused
// kernels) and a hand-written backward, joined to the graph like a built-in op. The
// distributed layer's SyncBatchNorm is written this way.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::autograd {

// Receives one gradient per output (undefined where none flowed) and returns one per input
// (undefined where the input needs none).
using BackwardFunction =
    std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// Whether `backward` can itself be differentiated (create_graph). kTwice: it is written in
// recorded ops and closes over tensors with their history, so a create_graph backward records
// it. kOnce (PyTorch's @once_differentiable): it is not (collectives, fused kernels); a second
// backward through the gradients it gave under create_graph is an ember::Error naming it.
enum class Differentiability { kTwice, kOnce };

// Runs `forward` with recording off; when grad mode is on and an input requires grad, the
// floating outputs get a node named `name` that calls `backward`. Returns the outputs.
std::vector<Tensor> apply_function(const std::string& name, const std::vector<Tensor>& inputs,
                                   const std::function<std::vector<Tensor>()>& forward,
                                   BackwardFunction backward,
                                   Differentiability differentiability = Differentiability::kTwice);

}  // namespace ember::autograd

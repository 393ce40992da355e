// Finite-difference gradient checking, shared by every op's test.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::autograd {

struct GradcheckOptions {
  double eps = 1e-6;   // central-difference step
  double atol = 1e-5;  // |analytic - numeric| <= atol + rtol * |numeric|
  double rtol = 1e-3;
  uint64_t seed = 0;  // for the random output weights
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the first mismatch, when !ok
  explicit operator bool() const { return ok; }
};

// Compares the gradients backward() gives for `inputs` (contiguous f64 CPU tensors; those
// that require grad are checked) with central finite differences of sum(f(inputs) * w), for
// fixed random weights w.
GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

// torch.autograd.gradgradcheck: checks second derivatives. The first gradients of
// sum(f(inputs) * u), taken by a create_graph backward with a random output gradient u that
// itself requires grad, are checked by gradcheck as a function of the inputs and of u. A
// backward that records no history of its own (a fused kernel run under create_graph) fails
// it: its gradient would be a constant to a second backward.
GradcheckResult gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<Tensor>& inputs,
                              const GradcheckOptions& options = {});

}  // namespace ember::autograd

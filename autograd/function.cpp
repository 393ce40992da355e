#include "function.h"

#include <ember/tensor/grad_mode.h>

#include "node.h"

namespace ember::autograd {

namespace {

class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, uint32_t num_outputs, std::vector<Shape> input_sizes,
               BackwardFunction backward, Differentiability differentiability)
      : Node(num_outputs),
        name_(std::move(name)),
        input_sizes_(std::move(input_sizes)),
        backward_(std::move(backward)),
        differentiability_(differentiability) {}

  std::string name() const override { return name_; }
  // The backward function holds what it saved; dropping it frees them.
  void release_saved() override {
    backward_ = nullptr;
    released_ = true;
  }

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    EMBER_CHECK(!released_, "backward", "trying to backward through the graph a second time (",
                name_, "); pass retain_graph=true to the first backward");
    std::vector<Tensor> result = backward_(grads);
    EMBER_CHECK(result.size() == input_sizes_.size(), name_, "backward returned ", result.size(),
                " gradients for ", input_sizes_.size(), " inputs");
    for (size_t i = 0; i < result.size(); ++i) {
      EMBER_CHECK(!result[i].defined() || result[i].sizes() == input_sizes_[i], name_,
                  "backward returned a gradient ", "of shape ", shape_str(result[i].sizes()),
                  " for input ", i, " of shape ", shape_str(input_sizes_[i]));
      if (!next_edges()[i].valid()) result[i] = Tensor();
      if (result[i].defined() && GradMode::is_enabled() &&
          differentiability_ == Differentiability::kOnce) {
        result[i] = first_order_gradient(result[i], name_, *this, grads);
      }
    }
    return result;
  }

 private:
  std::string name_;
  std::vector<Shape> input_sizes_;
  BackwardFunction backward_;
  Differentiability differentiability_;
  bool released_ = false;
};

}  // namespace

std::vector<Tensor> apply_function(const std::string& name, const std::vector<Tensor>& inputs,
                                   const std::function<std::vector<Tensor>()>& forward,
                                   BackwardFunction backward, Differentiability differentiability) {
  bool recording = GradMode::is_enabled();
  if (recording) {
    recording = false;
    for (const Tensor& t : inputs) recording = recording || (t.defined() && t.requires_grad());
  }
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = forward();
  }
  if (!recording) return outputs;
  std::vector<Shape> sizes;
  for (const Tensor& t : inputs) sizes.push_back(t.defined() ? t.sizes() : Shape{});
  auto node =
      std::make_shared<FunctionNode>(name, static_cast<uint32_t>(outputs.size()), std::move(sizes),
                                     std::move(backward), differentiability);
  for (const Tensor& t : inputs) node->add_next_edge(gradient_edge(t));
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].defined() || !outputs[i].is_floating_point()) continue;
    AutogradMeta& meta = outputs[i].ensure_autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = static_cast<uint32_t>(i);
  }
  return outputs;
}

}  // namespace ember::autograd

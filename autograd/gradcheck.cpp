#include "gradcheck.h"

#include <cmath>
#include <sstream>

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/random.h>

#include "engine.h"

namespace ember::autograd {

GradcheckResult gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                          const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    EMBER_CHECK(x.defined() && x.dtype() == kF64 && x.is_cpu() && x.is_contiguous(), "gradcheck",
                "input ", i, " must be a contiguous f64 CPU tensor");
    if (x.requires_grad()) x.set_grad(Tensor());
  }
  Tensor weights;
  auto loss = [&](const Tensor& out) { return sum(out * weights).item<double>(); };

  const Tensor output = f(inputs);
  EMBER_CHECK(output.requires_grad(), "gradcheck", "the function's output does not require grad");
  Generator generator(options.seed);
  weights = randn(output.sizes(), kF64, &generator);
  sum(output * weights).backward();

  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& x = inputs[i];
    if (!x.requires_grad()) continue;
    const Tensor analytic = x.grad().defined() ? x.grad() : zeros_like(x);
    const auto analytic_values = analytic.to_vector<double>();
    double* data = static_cast<double*>(x.data_ptr());
    NoGradGuard no_grad;
    for (int64_t j = 0; j < x.numel(); ++j) {
      const double original = data[j];
      data[j] = original + options.eps;
      const double plus = loss(f(inputs));
      data[j] = original - options.eps;
      const double minus = loss(f(inputs));
      data[j] = original;
      const double numeric = (plus - minus) / (2 * options.eps);
      const double a = analytic_values[static_cast<size_t>(j)];
      if (!(std::abs(a - numeric) <= options.atol + options.rtol * std::abs(numeric))) {
        std::ostringstream message;
        message << "gradcheck: input " << i << " (shape " << shape_str(x.sizes()) << "), element "
                << j << ": analytic " << a << " vs numeric " << numeric;
        return {false, message.str()};
      }
    }
  }
  return {};
}

GradcheckResult gradgradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                              const std::vector<Tensor>& inputs, const GradcheckOptions& options) {
  Tensor output;
  {
    const GradModeGuard recording(true);
    output = f(inputs);
  }
  EMBER_CHECK(output.requires_grad(), "gradgradcheck",
              "the function's output does not require grad");
  Generator generator(options.seed + 1);
  Tensor output_grad = randn(output.sizes(), kF64, &generator);
  output_grad.requires_grad_();

  // The first gradients of every input that requires grad, flattened into one tensor, as a
  // function of (inputs..., output_grad). gradcheck evaluates it without grad mode for its
  // finite differences; the first backward needs the forward recorded all the same.
  bool recorded = true;  // every defined first gradient has a history
  auto first_gradients = [&](const std::vector<Tensor>& v) {
    const GradModeGuard recording(true);
    const std::vector<Tensor> xs(v.begin(), v.end() - 1);
    std::vector<Tensor> wrt;
    for (const Tensor& x : xs) {
      if (x.requires_grad()) wrt.push_back(x);
    }
    const std::vector<Tensor> grads = grad({f(xs)}, wrt, {v.back()}, std::nullopt, true, true);
    std::vector<Tensor> parts;
    for (size_t i = 0; i < wrt.size(); ++i) {
      recorded = recorded && (!grads[i].defined() || grads[i].requires_grad());
      parts.push_back((grads[i].defined() ? grads[i] : zeros_like(wrt[i])).reshape({-1}));
    }
    return cat(parts, 0);
  };
  std::vector<Tensor> all = inputs;
  all.push_back(output_grad);
  const Tensor probe = first_gradients(all);
  if (!recorded || !probe.requires_grad()) {
    return {false, "gradgradcheck: a first gradient recorded no history under create_graph"};
  }
  GradcheckResult result = gradcheck(first_gradients, all, options);
  if (!result.ok) result.message = "gradgradcheck: the first gradients' " + result.message;
  return result;
}

}  // namespace ember::autograd

#include "adam.h"

#include <algorithm>
#include <cmath>

#include <ember/tensor/multi_tensor.h>
#include <ember/tensor/ops.h>

namespace ember::optim {

namespace {

Options adam_options(double lr, std::pair<double, double> betas, double eps, double weight_decay,
                     bool amsgrad) {
  return {{"lr", lr},   {"beta1", betas.first},         {"beta2", betas.second},
          {"eps", eps}, {"weight_decay", weight_decay}, {"amsgrad", amsgrad ? 1.0 : 0.0}};
}

std::vector<ParamGroup> one_group(std::vector<Tensor> params) {
  return {ParamGroup(std::move(params))};
}

}  // namespace

Options AdamOptions::to_options() const {
  return adam_options(lr, betas, eps, weight_decay, amsgrad);
}

Options AdamWOptions::to_options() const {
  return adam_options(lr, betas, eps, weight_decay, amsgrad);
}

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam("Adam", one_group(std::move(params)), options.to_options(), false, options.foreach,
           options.fused, options.capturable) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions defaults)
    : Adam("Adam", std::move(groups), defaults.to_options(), false, defaults.foreach,
           defaults.fused, defaults.capturable) {}

Adam::Adam(const char* name, std::vector<ParamGroup> groups, Options defaults, bool decoupled,
           std::optional<bool> foreach, bool fused, bool capturable)
    : MultiTensorOptimizer(name, std::move(defaults), foreach, fused),
      decoupled_weight_decay_(decoupled) {
  check_options(this->defaults());
  EMBER_CHECK(!groups.empty(), this->name(), "got an empty parameter list");
  for (auto& group : groups) add_param_group(std::move(group));
  set_capturable(capturable);
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Adam("AdamW", one_group(std::move(params)), options.to_options(), true, options.foreach,
           options.fused, options.capturable) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions defaults)
    : Adam("AdamW", std::move(groups), defaults.to_options(), true, defaults.foreach,
           defaults.fused, defaults.capturable) {}

void Adam::check_options(const Options& options) const {
  const double lr = options.at("lr");
  const double beta1 = options.at("beta1");
  const double beta2 = options.at("beta2");
  const double eps = options.at("eps");
  const double weight_decay = options.at("weight_decay");
  const double amsgrad = options.at("amsgrad");
  EMBER_CHECK(lr >= 0.0, name(), "invalid learning rate ", lr, " (must be >= 0)");
  EMBER_CHECK(beta1 >= 0.0 && beta1 < 1.0, name(), "invalid beta1 ", beta1, " (must be in [0, 1))");
  EMBER_CHECK(beta2 >= 0.0 && beta2 < 1.0, name(), "invalid beta2 ", beta2, " (must be in [0, 1))");
  EMBER_CHECK(eps > 0.0, name(), "invalid eps ", eps, " (must be > 0)");
  EMBER_CHECK(weight_decay >= 0.0, name(), "invalid weight_decay ", weight_decay,
              " (must be >= 0)");
  EMBER_CHECK(amsgrad == 0.0 || amsgrad == 1.0, name(), "amsgrad must be 0 or 1, got ", amsgrad);
}

std::string Adam::device_refusal(const ParamGroup& group,
                                 const std::vector<ParamState>& state) const {
  std::vector<const char*> required = {"exp_avg", "exp_avg_sq"};
  if (group.option("amsgrad") != 0.0) required.push_back("max_exp_avg_sq");
  return detail::device_update_refusal(
      group, state, mode(), {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, required, capturable());
}

void Adam::step_group(ParamGroup& group, std::vector<ParamState>& state,
                      const DeviceInputs& device) {
  const AdamUpdate update{group.option("lr"),
                          group.option("beta1"),
                          group.option("beta2"),
                          group.option("eps"),
                          group.option("weight_decay"),
                          decoupled_weight_decay_,
                          group.option("amsgrad") != 0.0};
  const double lr = update.lr, beta1 = update.beta1, beta2 = update.beta2, eps = update.eps;
  const double weight_decay = update.weight_decay;
  const bool amsgrad = update.amsgrad;
  const detail::ParamSplit split =
      detail::split_params(group, state, mode(), {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"});

  // The parameter's buffers, created (zero) on its first update.
  auto buffer = [&](size_t i, const char* name) -> Tensor& {
    auto& buffers = state[i].buffers;
    auto it = buffers.find(name);
    if (it == buffers.end()) it = buffers.emplace(name, zeros_like(group.params[i])).first;
    return it->second;
  };

  for (const detail::ParamBucket& bucket : split.buckets) {
    // Device inputs keep the counts on the device, where the pass increments them (unless
    // found_inf); a count already there stays there.
    const bool device_steps =
        device.any() || std::any_of(bucket.indices.begin(), bucket.indices.end(),
                                    [&](size_t i) { return state[i].device_step.defined(); });
    std::vector<Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, counts;
    std::vector<int64_t> steps;
    for (const size_t i : bucket.indices) {
      params.push_back(group.params[i]);
      grads.push_back(group.params[i].grad());
      exp_avgs.push_back(buffer(i, "exp_avg"));
      exp_avg_sqs.push_back(buffer(i, "exp_avg_sq"));
      if (amsgrad) max_exp_avg_sqs.push_back(buffer(i, "max_exp_avg_sq"));
      ParamState& s = state[i];
      if (!device_steps) {
        steps.push_back(++s.step);
        continue;
      }
      if (!s.device_step.defined())
        s.device_step = scalar_tensor(s.step, TensorOptions(kI64, bucket.device));
      counts.push_back(s.device_step);
    }
    MultiTensorDeviceArgs args = device.for_device(bucket.device);
    args.steps = counts;
    multi_tensor_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, update, args);
  }

  for (const size_t i : split.single) {
    Tensor& p = group.params[i];
    if (state[i].device_step.defined()) {  // back on the host path: the count comes back
      state[i].step = state[i].step_count();
      state[i].device_step = Tensor();
    }
    Tensor& exp_avg = buffer(i, "exp_avg");
    Tensor& exp_avg_sq = buffer(i, "exp_avg_sq");
    const int64_t step = ++state[i].step;
    Tensor grad = p.grad();
    if (weight_decay != 0.0) {
      if (decoupled_weight_decay_)
        p.mul_(1.0 - lr * weight_decay);
      else
        grad = add(grad, p, weight_decay);
    }
    exp_avg.mul_(beta1).add_(grad, 1.0 - beta1);
    // One scratch tensor: first grad^2, then the denominator.
    Tensor scratch = mul(grad, grad);
    exp_avg_sq.mul_(beta2).add_(scratch, 1.0 - beta2);

    const double t = static_cast<double>(step);
    const double bias_correction1 = 1.0 - std::pow(beta1, t);
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(beta2, t));
    const double step_size = lr / bias_correction1;
    if (amsgrad) {
      Tensor& max_exp_avg_sq = buffer(i, "max_exp_avg_sq");
      max_exp_avg_sq.maximum_(exp_avg_sq);
      scratch.copy_(max_exp_avg_sq);
    } else {
      scratch.copy_(exp_avg_sq);
    }
    scratch.sqrt_().div_(bias_correction2_sqrt).add_(eps);
    p.add_(div(exp_avg, scratch), -step_size);
  }
}

}  // namespace ember::optim

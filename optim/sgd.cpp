#include "sgd.h"

#include <ember/tensor/multi_tensor.h>
#include <ember/tensor/ops.h>

namespace ember::optim {

Options SGDOptions::to_options() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0}};
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : SGD(std::vector<ParamGroup>{ParamGroup(std::move(params))}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions defaults)
    : MultiTensorOptimizer("SGD", defaults.to_options(), defaults.foreach, defaults.fused) {
  check_options(this->defaults());
  EMBER_CHECK(!groups.empty(), "SGD", "got an empty parameter list");
  for (auto& group : groups) add_param_group(std::move(group));
  set_capturable(defaults.capturable);
}

void SGD::check_options(const Options& options) const {
  const double lr = options.at("lr");
  const double momentum = options.at("momentum");
  const double dampening = options.at("dampening");
  const double weight_decay = options.at("weight_decay");
  const double nesterov = options.at("nesterov");
  EMBER_CHECK(lr >= 0.0, "SGD", "invalid learning rate ", lr, " (must be >= 0)");
  EMBER_CHECK(momentum >= 0.0, "SGD", "invalid momentum ", momentum, " (must be >= 0)");
  EMBER_CHECK(weight_decay >= 0.0, "SGD", "invalid weight_decay ", weight_decay, " (must be >= 0)");
  EMBER_CHECK(nesterov == 0.0 || nesterov == 1.0, "SGD", "nesterov must be 0 or 1, got ", nesterov);
  EMBER_CHECK(nesterov == 0.0 || (momentum > 0.0 && dampening == 0.0), "SGD",
              "Nesterov momentum requires momentum > 0 and dampening == 0 (momentum ", momentum,
              ", dampening ", dampening, ")");
}

std::string SGD::device_refusal(const ParamGroup& group,
                                const std::vector<ParamState>& state) const {
  std::vector<const char*> required;
  if (group.option("momentum") != 0.0) required.push_back("momentum_buffer");
  return detail::device_update_refusal(group, state, mode(), {"momentum_buffer"}, required, false);
}

void SGD::step_group(ParamGroup& group, std::vector<ParamState>& state,
                     const DeviceInputs& device) {
  const SGDUpdate update{group.option("lr"), group.option("momentum"), group.option("dampening"),
                         group.option("weight_decay"), group.option("nesterov") != 0.0};
  const bool momentum = update.momentum != 0.0;
  const detail::ParamSplit split = detail::split_params(group, state, mode(), {"momentum_buffer"});

  for (const detail::ParamBucket& bucket : split.buckets) {
    std::vector<Tensor> params, grads, buffers;
    std::vector<uint8_t> fresh;
    for (const size_t i : bucket.indices) {
      params.push_back(group.params[i]);
      grads.push_back(group.params[i].grad());
      if (!momentum) continue;
      auto& state_buffers = state[i].buffers;
      auto it = state_buffers.find("momentum_buffer");
      fresh.push_back(it == state_buffers.end() ? 1 : 0);
      if (fresh.back())
        it = state_buffers.emplace("momentum_buffer", empty_like(params.back())).first;
      buffers.push_back(it->second);
    }
    multi_tensor_sgd_(params, grads, buffers, fresh, update, device.for_device(bucket.device));
  }

  for (const size_t i : split.single) {
    Tensor& p = group.params[i];
    // d_p aliases the gradient until something needs to be written into it.
    Tensor d_p = p.grad();
    bool owned = false;
    if (update.weight_decay != 0.0) {
      d_p = add(d_p, p, update.weight_decay);
      owned = true;
    }
    if (momentum) {
      auto& buffers = state[i].buffers;
      auto it = buffers.find("momentum_buffer");
      if (it == buffers.end()) {
        it = buffers.emplace("momentum_buffer", d_p.clone()).first;
      } else {
        it->second.mul_(update.momentum).add_(d_p, 1.0 - update.dampening);
      }
      if (update.nesterov) {
        if (owned)
          d_p.add_(it->second, update.momentum);
        else
          d_p = add(d_p, it->second, update.momentum);
      } else {
        d_p = it->second;
      }
    }
    p.add_(d_p, -update.lr);
  }
}

}  // namespace ember::optim

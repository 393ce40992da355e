#include "param_groups.h"

#include <algorithm>
#include <utility>

#include <ember/tensor/error.h>

namespace ember::optim {

const std::vector<std::string>& default_no_decay_modules() {
  static const std::vector<std::string> kModules = {"LayerNorm",     "BatchNorm1d", "BatchNorm2d",
                                                    "SyncBatchNorm", "GroupNorm",   "Embedding"};
  return kModules;
}

namespace {

// nanogpt: the shape alone decides; otherwise minGPT's rule with these module types excluded.
WeightDecaySplit split(nn::Module& model, bool nanogpt,
                       const std::vector<std::string>& no_decay_modules) {
  struct Entry {
    std::string name;
    Tensor param;
    bool decays;
  };
  std::vector<Entry> entries;
  for (const auto& [prefix, module] : model.named_modules()) {
    const bool excluded_module = std::find(no_decay_modules.begin(), no_decay_modules.end(),
                                           module->name()) != no_decay_modules.end();
    for (const auto& [name, param] : module->named_parameters(/*recurse=*/false)) {
      if (!param.requires_grad()) continue;
      const bool decays = param.dim() >= 2 && (nanogpt || (!excluded_module && name != "bias"));
      const auto same = std::find_if(entries.begin(), entries.end(),
                                     [&](const Entry& e) { return e.param.is_same(param); });
      if (same != entries.end()) {
        same->decays = same->decays && decays;
        continue;
      }
      entries.push_back({prefix.empty() ? name : prefix + "." + name, param, decays});
    }
  }
  WeightDecaySplit out;
  for (auto& e : entries) (e.decays ? out.decay : out.no_decay).emplace_back(e.name, e.param);
  return out;
}

std::vector<ParamGroup> groups_of(const WeightDecaySplit& split, double weight_decay) {
  EMBER_CHECK(weight_decay >= 0, "weight_decay_groups", "weight_decay must be >= 0, got ",
              weight_decay);
  const auto tensors = [](const nn::NamedTensors& named) {
    std::vector<Tensor> out;
    for (const auto& [name, t] : named) out.push_back(t);
    return out;
  };
  std::vector<ParamGroup> groups;
  if (!split.decay.empty())
    groups.emplace_back(tensors(split.decay), Options{{"weight_decay", weight_decay}});
  if (!split.no_decay.empty())
    groups.emplace_back(tensors(split.no_decay), Options{{"weight_decay", 0.0}});
  return groups;
}

}  // namespace

WeightDecaySplit split_weight_decay(nn::Module& model, WeightDecayRule rule) {
  return split(model, rule == WeightDecayRule::kNanoGPT, default_no_decay_modules());
}

WeightDecaySplit split_weight_decay(nn::Module& model,
                                    const std::vector<std::string>& no_decay_modules) {
  return split(model, /*nanogpt=*/false, no_decay_modules);
}

std::vector<ParamGroup> weight_decay_groups(nn::Module& model, double weight_decay,
                                            WeightDecayRule rule) {
  return groups_of(split_weight_decay(model, rule), weight_decay);
}

std::vector<ParamGroup> weight_decay_groups(nn::Module& model, double weight_decay,
                                            const std::vector<std::string>& no_decay_modules) {
  return groups_of(split_weight_decay(model, no_decay_modules), weight_decay);
}

}  // namespace ember::optim

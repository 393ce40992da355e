#include "optimizer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <string_view>

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

namespace ember::optim {

namespace {

// Splits "<prefix>.<index>.<rest>"; false when `key` has another form.
bool split_key(const std::string& key, const std::string& prefix, size_t& index,
               std::string& rest) {
  if (key.size() <= prefix.size() + 1 || key.compare(0, prefix.size(), prefix) != 0 ||
      key[prefix.size()] != '.')
    return false;
  const char* begin = key.data() + prefix.size() + 1;
  const char* end = key.data() + key.size();
  const auto [ptr, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc() || ptr == begin || ptr == end || *ptr != '.' || ptr + 1 == end)
    return false;
  rest.assign(ptr + 1, end);
  return true;
}

std::string group_key(size_t group, const std::string& name) {
  return "param_groups." + std::to_string(group) + "." + name;
}

// The key that records which optimizer wrote a state dict ("type.SGD" = 1).
constexpr std::string_view kTypePrefix = "type.";

bool is_type_key(const std::string& key) { return key.starts_with(kTypePrefix); }

}  // namespace

double ParamGroup::option(const std::string& name) const {
  const auto it = options.find(name);
  EMBER_CHECK(it != options.end(), "ParamGroup", "no option named \"", name, "\"");
  return it->second;
}

Optimizer::Optimizer(std::string name, Options defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {}

void Optimizer::add_param_group(ParamGroup group) {
  EMBER_CHECK(!group.params.empty(), name_, "a parameter group needs at least one parameter");
  for (const auto& [key, value] : group.options) {
    EMBER_CHECK(defaults_.count(key) != 0, name_, "unknown option \"", key, "\" (= ", value,
                ") in a parameter group");
  }
  for (const auto& [key, value] : defaults_) group.options.emplace(key, value);
  check_options(group.options);

  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    EMBER_CHECK(p.defined(), name_, "parameter ", i, " of the new group is undefined");
    EMBER_CHECK(p.is_floating_point(), name_, "parameter ", i, " of the new group has dtype ",
                p.dtype(), "; only floating-point tensors can be optimized");
    EMBER_CHECK(p.requires_grad(), name_, "parameter ", i, " of the new group (shape ",
                shape_str(p.sizes()), ") does not require grad");
    EMBER_CHECK(p.is_leaf(), name_, "parameter ", i, " of the new group (shape ",
                shape_str(p.sizes()), ") is not a leaf; only leaves can be optimized");
    for (size_t j = 0; j < i; ++j) {
      EMBER_CHECK(!p.is_same(group.params[j]), name_, "parameter ", i, " of the new group (shape ",
                  shape_str(p.sizes()), ") appears twice in it (also at ", j, ")");
    }
    for (size_t g = 0; g < groups_.size(); ++g) {
      for (size_t j = 0; j < groups_[g].params.size(); ++j) {
        EMBER_CHECK(!p.is_same(groups_[g].params[j]), name_, "parameter ", i,
                    " of the new group (shape ", shape_str(p.sizes()), ") is already parameter ", j,
                    " of group ", g);
      }
    }
  }
  state_.emplace_back(group.params.size());
  groups_.push_back(std::move(group));
}

void Optimizer::step() { run_step(nullptr); }

void Optimizer::step(const StepScaling& scaling) {
  const std::string op = name_ + "::step(scaling)";
  const Tensor& found = scaling.found_inf;
  const Tensor& inv = scaling.inv_scale;
  EMBER_CHECK(found.defined() && found.dtype() == kF32 && found.numel() == 1, op,
              "found_inf must be a 1-element f32 tensor, got ",
              found.defined()
                  ? detail::str_cat(found.dtype(), " of shape ", shape_str(found.sizes()))
                  : std::string("an undefined tensor"));
  EMBER_CHECK(!inv.defined() || (inv.dtype() == kF32 && inv.numel() == 1), op,
              "inv_scale must be a 1-element f32 tensor, got ", inv.dtype(), " of shape ",
              shape_str(inv.sizes()));
  EMBER_CHECK(!inv.defined() || inv.device() == found.device(), op, "inv_scale is on ",
              inv.device(), " but found_inf on ", found.device());
  const std::string why = device_step_refusal();
  EMBER_CHECK(why.empty(), op, why);
  run_step(&scaling);
}

void Optimizer::run_step(const StepScaling* scaling) {
  NoGradGuard no_grad;
  prepare_capturable();
  for (size_t g = 0; g < groups_.size(); ++g) {
    // param_groups() is mutable, so keep the state parallel to the parameters.
    state_[g].resize(groups_[g].params.size());
    DeviceInputs device;
    device.scaling = scaling;
    if (capturable_) device.lr = &device_lr_[g].scalars;
    step_group(groups_[g], state_[g], device);
  }
}

std::string Optimizer::device_step_refusal() const {
  for (size_t g = 0; g < groups_.size(); ++g) {
    // Parameters added to the group since the last step have no state yet.
    std::vector<ParamState> grown;
    if (state_[g].size() != groups_[g].params.size()) {
      grown = state_[g];
      grown.resize(groups_[g].params.size());
    }
    const std::string why = device_refusal(groups_[g], grown.empty() ? state_[g] : grown);
    if (!why.empty()) return detail::str_cat("group ", g, ": ", why);
  }
  return "";
}

std::string Optimizer::device_refusal(const ParamGroup& /*group*/,
                                      const std::vector<ParamState>& /*state*/) const {
  return name_ + " has no multi-tensor update";
}

void Optimizer::set_capturable(bool capturable) {
  EMBER_CHECK(!capturable || has_multi_tensor_update(), name_,
              "capturable = true needs the multi-tensor update, which this optimizer does not "
              "use (foreach = false selects the per-parameter one)");
  capturable_ = capturable;
}

void Optimizer::prepare_capturable() {
  if (!capturable_) return;
  NoGradGuard no_grad;
  device_lr_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) {
    DeviceLr& lr = device_lr_[g];
    const double value = groups_[g].lr();
    // NOTE: a fill only where the value changed, so a step captured in a CUDA graph records
    // none (it would rewrite the capture's lr at every replay).
    if (value != lr.written) {
      for (auto& entry : lr.scalars) entry.second.fill_(value);
      lr.written = value;
    }
    for (const Tensor& p : groups_[g].params) {
      const auto has = [&](const auto& entry) { return entry.first == p.device(); };
      if (std::none_of(lr.scalars.begin(), lr.scalars.end(), has))
        lr.scalars.emplace_back(p.device(), scalar_tensor(value, TensorOptions(kF64, p.device())));
    }
  }
}

MultiTensorDeviceArgs Optimizer::DeviceInputs::for_device(Device device) const {
  MultiTensorDeviceArgs args;
  if (lr != nullptr) {
    for (const auto& [on, value] : *lr)
      if (on == device) args.lr = value;
  }
  if (scaling != nullptr) {
    if (scaling->inv_scale.defined()) args.inv_scale = scaling->inv_scale.to(device);
    args.found_inf = scaling->found_inf.to(device);
  }
  return args;
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& group : groups_) {
    for (auto& p : group.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        Tensor grad = p.grad();
        grad.zero_();
      }
    }
  }
}

const ParamState& Optimizer::state(size_t group, size_t index) const {
  EMBER_CHECK(group < groups_.size() && index < groups_[group].params.size(), name_,
              "no parameter ", index, " in group ", group, " (", groups_.size(), " groups)");
  static const ParamState kEmpty;
  return index < state_[group].size() ? state_[group][index] : kEmpty;
}

void Optimizer::set_state(size_t group, size_t index, const ParamState& state) {
  EMBER_CHECK(group < groups_.size() && index < groups_[group].params.size(), name_,
              "set_state: no parameter ", index, " in group ", group, " (", groups_.size(),
              " groups)");
  const Tensor& p = groups_[group].params[index];
  ParamState copy;
  copy.step = state.step_count();
  NoGradGuard no_grad;
  for (const auto& [name, buffer] : state.buffers) {
    EMBER_CHECK(buffer.defined() && buffer.sizes() == p.sizes(), name_, "set_state: buffer \"",
                name, "\" has shape ",
                buffer.defined() ? shape_str(buffer.sizes()) : std::string("undefined"),
                " but parameter ", index, " of group ", group, " has shape ", shape_str(p.sizes()));
    Tensor own = empty(p.sizes(), p.options());
    own.copy_(buffer);
    copy.buffers[name] = own;
  }
  state_[group].resize(groups_[group].params.size());
  state_[group][index] = std::move(copy);
}

void Optimizer::agree_found_inf(std::vector<std::pair<Device, Tensor>>& /*flags*/) {}

StateDict Optimizer::state_dict() const {
  StateDict dict;
  dict.scalars[std::string(kTypePrefix) + name_] = 1.0;
  size_t k = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& [key, value] : groups_[g].options) dict.scalars[group_key(g, key)] = value;
    dict.scalars[group_key(g, "num_params")] = static_cast<double>(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i, ++k) {
      if (i >= state_[g].size() || state_[g][i].empty()) continue;
      const ParamState& s = state_[g][i];
      const std::string prefix = "state." + std::to_string(k) + ".";
      dict.scalars[prefix + "step"] = static_cast<double>(s.step_count());
      for (const auto& [name, buffer] : s.buffers) dict.tensors[prefix + name] = buffer;
    }
  }
  return dict;
}

void Optimizer::load_state_dict(const StateDict& dict) {
  // Another optimizer's state (AdamW's into SGD, Adam's into AdamW) is refused by name before
  // anything else; dicts without a type key (written before ember recorded it) are checked
  // by their contents alone.
  for (const auto& [key, value] : dict.scalars) {
    if (!is_type_key(key)) continue;
    const std::string source = key.substr(kTypePrefix.size());
    EMBER_CHECK(source == name_, name_, "load_state_dict: the state is from ", source, ", not ",
                name_, "; load it into the optimizer that saved it (", source, ")");
  }
  // Where each global parameter index k lives.
  std::vector<std::pair<size_t, size_t>> where;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t i = 0; i < groups_[g].params.size(); ++i) where.emplace_back(g, i);

  std::vector<Options> options(groups_.size());
  std::vector<std::vector<ParamState>> state(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) state[g].resize(groups_[g].params.size());

  size_t index = 0;
  std::string rest;
  size_t dict_groups = 0;
  for (const auto& [key, value] : dict.scalars) {
    if (split_key(key, "param_groups", index, rest)) dict_groups = std::max(dict_groups, index + 1);
  }
  EMBER_CHECK(dict_groups == groups_.size(), name_, "load_state_dict: the state dict has ",
              dict_groups, " param groups but the optimizer has ", groups_.size());
  for (const auto& [key, value] : dict.scalars) {
    if (split_key(key, "param_groups", index, rest)) {
      if (rest == "num_params") {
        EMBER_CHECK(value == static_cast<double>(groups_[index].params.size()), name_,
                    "load_state_dict: group ", index, " has ", groups_[index].params.size(),
                    " parameters but the state dict has ", value);
      } else {
        EMBER_CHECK(defaults_.count(rest) != 0, name_, "load_state_dict: unknown option \"", rest,
                    "\" in group ", index);
        options[index][rest] = value;
      }
    } else if (is_type_key(key)) {
      continue;
    } else if (split_key(key, "state", index, rest) && rest == "step") {
      EMBER_CHECK(index < where.size(), name_, "load_state_dict: state for parameter ", index,
                  " but the optimizer has ", where.size(), " parameters");
      EMBER_CHECK(value >= 0 && value == std::floor(value), name_, "load_state_dict: invalid step ",
                  value, " for parameter ", index);
      state[where[index].first][where[index].second].step = static_cast<int64_t>(value);
    } else {
      EMBER_CHECK(false, name_, "load_state_dict: unexpected scalar \"", key, "\"");
    }
  }
  for (size_t g = 0; g < groups_.size(); ++g) {
    EMBER_CHECK(dict.scalars.count(group_key(g, "num_params")) != 0, name_,
                "load_state_dict: the state dict has no group ", g, " (the optimizer has ",
                groups_.size(), " groups)");
    for (const auto& [key, value] : groups_[g].options) {
      EMBER_CHECK(options[g].count(key) != 0, name_, "load_state_dict: group ", g,
                  " lacks option \"", key, "\"");
    }
    check_options(options[g]);
  }
  for (const auto& [key, tensor] : dict.tensors) {
    EMBER_CHECK(split_key(key, "state", index, rest) && rest != "step", name_,
                "load_state_dict: unexpected tensor \"", key, "\"");
    EMBER_CHECK(index < where.size(), name_, "load_state_dict: state for parameter ", index,
                " but the optimizer has ", where.size(), " parameters");
    const auto [g, i] = where[index];
    const Tensor& p = groups_[g].params[i];
    EMBER_CHECK(tensor.defined() && tensor.sizes() == p.sizes(), name_, "load_state_dict: \"", key,
                "\" has shape ", tensor.defined() ? shape_str(tensor.sizes()) : "undefined",
                " but parameter ", index, " has shape ", shape_str(p.sizes()));
    Tensor copy = empty(p.sizes(), p.options());
    {
      NoGradGuard no_grad;
      copy.copy_(tensor);
    }
    state[g][i].buffers[rest] = copy;
  }

  for (size_t g = 0; g < groups_.size(); ++g) groups_[g].options = std::move(options[g]);
  state_ = std::move(state);
}

}  // namespace ember::optim

#include "module.h"

#include <algorithm>
#include <map>
#include <set>

#include <ember/tensor/autocast.h>

namespace ember::nn {

namespace {
// The module whose default forward() or forward_list() is running on this thread: the
// other default finding it there means the module overrides neither.
thread_local const Module* falling_back = nullptr;

class FallbackScope {
 public:
  FallbackScope(const Module* module) : previous_(falling_back) {
    EMBER_CHECK(falling_back != module, module->name(),
                "defines neither forward(input) nor forward_list(inputs)");
    falling_back = module;
  }
  ~FallbackScope() { falling_back = previous_; }
  FallbackScope(const FallbackScope&) = delete;
  FallbackScope& operator=(const FallbackScope&) = delete;

 private:
  const Module* previous_;
};
}  // namespace

namespace {
// The modules being called through ModuleCall on this thread, with their paths.
thread_local std::vector<std::pair<const Module*, std::string>> calls;
}  // namespace

void ModuleCall::begin(const Module& module) {
  std::string path = module.name();
  if (calls.empty()) {
    path.clear();  // the root of named_modules()
  } else {
    const auto& [parent, parent_path] = calls.back();
    for (const auto& [name, child] : parent->named_children()) {
      if (child.get() != &module) continue;
      path = parent_path.empty() ? name : parent_path + "." + name;
      break;
    }
  }
  calls.emplace_back(&module, path);
  scope_.emplace(std::move(path), module.name());
}

ModuleCall::~ModuleCall() {
  if (!scope_) return;
  scope_.reset();
  calls.pop_back();
}

Tensor Module::operator()(const Tensor& input) {
  const ModuleCall call(*this);
  return forward(input);
}

TensorList Module::operator()(const TensorList& inputs) {
  const ModuleCall call(*this);
  return forward_list(inputs);
}

Tensor Module::forward(const Tensor& input) {
  FallbackScope scope(this);
  TensorList outputs = forward_list({input});
  EMBER_CHECK(outputs.size() == 1, name(), "forward_list returns ", outputs.size(),
              " outputs; call forward_list() (or module(a, b, ...)) instead of forward(input)");
  return std::move(outputs[0]);
}

TensorList Module::forward_list(const TensorList& inputs) {
  FallbackScope scope(this);
  EMBER_CHECK(inputs.size() == 1, name(), "takes one input (forward(input)) but was given ",
              inputs.size());
  return {forward(inputs[0])};
}

void Module::check_input_matches(const Tensor& input, const char* what,
                                 const Tensor& parameter) const {
  if (!input.defined() || !parameter.defined()) return;
  // Under autocast the ops cast floating inputs and parameters themselves (a bf16 activation
  // meets an f32 weight by design).
  const bool autocast = is_autocast_enabled(input.device().type) && input.is_floating_point() &&
                        parameter.is_floating_point();
  EMBER_CHECK(
      (input.dtype() == parameter.dtype() || autocast) && input.device() == parameter.device(),
      name(), "input is ", input.dtype(), " on ", input.device(), " but the layer's ", what, " is ",
      parameter.dtype(), " on ", parameter.device(), " (input ", shape_str(input.sizes()), ", ",
      what, " ", shape_str(parameter.sizes()),
      "); convert the model (model.to(...)) or the input (input.to(...)) to match");
}

Tensor& Module::register_parameter(std::string name, Tensor tensor, bool requires_grad) {
  EMBER_CHECK(!name.empty() && name.find('.') == std::string::npos, this->name(),
              "invalid parameter name \"", name, "\"");
  for (const auto& [n, t] : parameters_)
    EMBER_CHECK(n != name, this->name(), "parameter \"", name, "\" exists");
  if (tensor.defined() && requires_grad) tensor.requires_grad_();
  parameters_.emplace_back(std::move(name), std::move(tensor));
  return parameters_.back().second;
}

Tensor& Module::register_buffer(std::string name, Tensor tensor) {
  EMBER_CHECK(!name.empty() && name.find('.') == std::string::npos, this->name(),
              "invalid buffer name \"", name, "\"");
  for (const auto& [n, t] : buffers_)
    EMBER_CHECK(n != name, this->name(), "buffer \"", name, "\" exists");
  buffers_.emplace_back(std::move(name), std::move(tensor));
  return buffers_.back().second;
}

void Module::add_child(std::string name, std::shared_ptr<Module> module) {
  EMBER_CHECK(module != nullptr, this->name(), "submodule \"", name, "\" is null");
  for (const auto& [n, m] : children_)
    EMBER_CHECK(n != name, this->name(), "submodule \"", name, "\" exists");
  children_.emplace_back(std::move(name), std::move(module));
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> module) {
  EMBER_CHECK(module != nullptr, this->name(), "replacement for submodule \"", name, "\" is null");
  for (auto& [n, m] : children_) {
    if (n == name) {
      m = std::move(module);
      return;
    }
  }
  throw Error(this->name() + ": no submodule named \"" + name + "\"");
}

Tensor& Module::buffer(const std::string& name) {
  for (auto& [n, t] : buffers_) {
    if (n == name) return t;
  }
  throw Error(this->name() + ": no buffer named \"" + name + "\"");
}

Tensor& Module::parameter(const std::string& name) {
  for (auto& [n, t] : parameters_) {
    if (n == name) return t;
  }
  throw Error(this->name() + ": no parameter named \"" + name + "\"");
}

void Module::collect(const std::string& prefix, bool recurse, bool parameters,
                     NamedTensors& out) const {
  for (const auto& [n, t] : parameters ? parameters_ : buffers_) {
    if (t.defined()) out.emplace_back(prefix + n, t);
  }
  if (!recurse) return;
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", true, parameters, out);
}

NamedTensors Module::named_parameters(bool recurse) const {
  NamedTensors all;
  collect("", recurse, true, all);
  // A tensor registered under several names (tied weights) is listed once, under its first.
  NamedTensors out;
  for (auto& [n, t] : all) {
    const bool seen = std::any_of(out.begin(), out.end(),
                                  [&](const auto& kept) { return kept.second.is_same(t); });
    if (!seen) out.emplace_back(std::move(n), std::move(t));
  }
  return out;
}

NamedTensors Module::named_buffers(bool recurse) const {
  NamedTensors out;
  collect("", recurse, false, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  // Depth-first in registration order: a module comes before its children.
  for (size_t i = 0; i < out.size(); ++i) {
    std::vector<std::pair<std::string, Module*>> below;
    for (auto& [n, child] : out[i].second->children_) {
      below.emplace_back(out[i].first.empty() ? n : out[i].first + "." + n, child.get());
    }
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(i) + 1, below.begin(), below.end());
  }
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;  // every name, tied weights under each of theirs (as PyTorch)
  collect("", true, true, out);
  NamedTensors buffers = named_buffers();
  out.insert(out.end(), buffers.begin(), buffers.end());
  return out;
}

void Module::load_state_dict(const NamedTensors& state, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [n, t] : state) given[n] = &t;
  NamedTensors own = state_dict();
  std::vector<std::string> missing, mismatched;
  std::set<std::string> used;
  for (const auto& [n, t] : own) {
    auto it = given.find(n);
    if (it == given.end()) {
      missing.push_back(n);
      continue;
    }
    used.insert(n);
    if (it->second->sizes() != t.sizes()) {
      mismatched.push_back(detail::str_cat(n, " (checkpoint ", shape_str(it->second->sizes()),
                                           ", model ", shape_str(t.sizes()), ")"));
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [n, t] : state) {
    if (!used.count(n)) unexpected.push_back(n);
  }
  auto join = [](const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  EMBER_CHECK(mismatched.empty(), "load_state_dict", "shape mismatch for ", join(mismatched));
  if (strict) {
    EMBER_CHECK(missing.empty() && unexpected.empty(), "load_state_dict",
                missing.empty() ? "" : "missing keys: " + join(missing),
                missing.empty() || unexpected.empty() ? "" : "; ",
                unexpected.empty() ? "" : "unexpected keys: " + join(unexpected));
  }
  NoGradGuard no_grad;
  for (auto& [n, t] : own) {
    auto it = given.find(n);
    if (it != given.end()) t.copy_(*it->second);
  }
}

void Module::to(Device device, bool non_blocking) {
  NoGradGuard no_grad;
  for (auto& [n, t] : state_dict()) {
    if (t.device() != device) t.set_data(t.to(device, non_blocking));
  }
}

void Module::to(DType dtype) {
  EMBER_CHECK(is_floating(dtype), name(), "modules convert only to floating dtypes, got ", dtype);
  NoGradGuard no_grad;
  for (auto& [n, t] : state_dict()) {
    if (t.is_floating_point() && t.dtype() != dtype) t.set_data(t.to(dtype));
  }
}

void Module::to(MemoryFormat format) {
  NoGradGuard no_grad;
  for (auto& [n, t] : state_dict()) {
    if (t.dim() == 4) t.set_data(t.to(format));
  }
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (auto& t : parameters()) {
    if (!t.grad().defined()) continue;
    if (set_to_none) {
      t.set_grad(Tensor());
    } else {
      Tensor g = t.grad();
      g.zero_();
    }
  }
}

int64_t parameter_count(const Module& module) {
  int64_t n = 0;
  for (const auto& t : module.parameters()) n += t.numel();
  return n;
}

}  // namespace ember::nn

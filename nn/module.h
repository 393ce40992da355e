// Module: the base of every layer and model. Parameters, buffers and submodules are
// registered by name, so named_parameters(), state_dict(), load_state_dict(), to(),
// train()/eval() and the distributed layer's bucketing all walk the same tree.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ember/autograd/autograd.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/trace.h>

namespace ember::nn {

// The inputs or outputs of a module with several (Module::forward_list).
using TensorList = std::vector<Tensor>;

// Name/tensor pairs in registration order ("layer1.0.conv1.weight", ...).
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. A layer with one input and one output overrides forward(); a model
  // with several inputs or outputs (a pair of images, inputs and a mask, two heads)
  // overrides forward_list(). Each falls back on the other, so either form calls any module:
  // forward(x) is forward_list({x})'s one output, and forward_list({x}) is {forward(x)}.
  //
  //   struct TwoHeads : nn::Module {
  //     TensorList forward_list(const TensorList& in) override { ... return {logits, box}; }
  //   };
  //   TensorList out = model(image, mask);   // out[0]: logits, out[1]: box
  //
  // Calling a module (module(x)) runs forward() as a ModuleCall: while a trace records
  // (ember::profiler), it times the forward and names it by the module's path. As with
  // PyTorch's hooks, calling forward() directly skips that.
  virtual Tensor forward(const Tensor& input);
  virtual TensorList forward_list(const TensorList& inputs);
  Tensor operator()(const Tensor& input);
  TensorList operator()(const TensorList& inputs);
  template <typename... More>
  TensorList operator()(const Tensor& first, const Tensor& second, const More&... more) {
    return (*this)(TensorList{first, second, more...});
  }
  // The type name used in printing and errors ("Conv2d", "ResNet", ...).
  virtual std::string name() const = 0;

  // A tensor registered under several names (weights tied across modules) is listed once,
  // under the first name, as PyTorch's named_parameters() does; state_dict() keeps every name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  NamedTensors named_parameters(bool recurse = true) const;
  NamedTensors named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const {
    return children_;
  }
  // This module and every one below it, depth-first, with dotted names ("" for this one).
  std::vector<std::pair<std::string, Module*>> named_modules();

  // Parameters and buffers by dotted name. load_state_dict copies values into the existing
  // tensors (converting dtype/device); strict mode reports missing and unexpected keys and
  // any shape mismatch, naming them, and changes nothing in that case.
  NamedTensors state_dict() const;
  void load_state_dict(const NamedTensors& state, bool strict = true);

  // Moves (or converts) every parameter and buffer in place; references stay valid.
  void to(Device device, bool non_blocking = false);
  void to(DType dtype);  // floating parameters and buffers only
  // model.to(memory_format=...): re-lays out the 4-d parameters and buffers (conv weights)
  // in `format`; other tensors keep theirs. Preserve changes nothing.
  void to(MemoryFormat format);
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad(bool set_to_none = true);

  // Replaces the registered submodule `name` (convert_sync_batchnorm uses this).
  void replace_module(const std::string& name, std::shared_ptr<Module> module);
  // Replaces the registered buffer `name` (load-time re-materialisation, conversions).
  Tensor& buffer(const std::string& name);
  Tensor& parameter(const std::string& name);

 protected:
  // ember::Error naming this module when `input` differs in dtype or device from its
  // parameter `what` (f64 data into an f32 layer, CPU data into a GPU model).
  void check_input_matches(const Tensor& input, const char* what, const Tensor& parameter) const;
  Tensor& register_parameter(std::string name, Tensor tensor, bool requires_grad = true);
  Tensor& register_buffer(std::string name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    add_child(std::move(name), module);
    return module;
  }

 private:
  void add_child(std::string name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, bool recurse, bool parameters, NamedTensors& out) const;

  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// One call of a module, for traces: while a trace records, its forward is timed under the
// module's path in named_modules() of the outermost module called (a child's: its parent's
// path, a dot, its registered name; a module called by one it is no child of: its type name),
// and the autograd nodes made inside carry it, so backward is timed per module too. Module's
// operator() opens one; a module that runs a submodule other than through it (a fused path)
// opens one for that submodule itself. Costs one relaxed atomic load when no trace records.
class ModuleCall {
 public:
  explicit ModuleCall(const Module& module) {
    if (trace::enabled()) begin(module);
  }
  ~ModuleCall();
  ModuleCall(const ModuleCall&) = delete;
  ModuleCall& operator=(const ModuleCall&) = delete;

 private:
  void begin(const Module& module);
  std::optional<trace::ModuleScope> scope_;
};

// The number of elements in all parameters.
int64_t parameter_count(const Module& module);

}  // namespace ember::nn

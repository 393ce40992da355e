// Optimizer: the base of SGD, Adam and AdamW (torch.optim.Optimizer's model).
//
// Parameters live in groups; every group carries its own options (lr, momentum,
// weight_decay, ...) as named numbers, so schedules and checkpoints treat every optimizer
// alike. Options a group does not name are taken from the optimizer's defaults. Each
// parameter has its own state (a step count and named buffers such as "momentum_buffer",
// "exp_avg"), created lazily on its first update.
//
//   optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9, .nesterov = true});
//   sgd.add_param_group({head.parameters(), {{"lr", 0.01}}});
//   loss.backward();
//   sgd.step();
//   sgd.zero_grad();
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ember/autograd/autograd.h>
#include <ember/tensor/tensor.h>

namespace ember::optim {

// Named hyper-parameters of one group. Flags (nesterov, amsgrad) are stored as 0 or 1.
using Options = std::map<std::string, double>;

struct ParamGroup {
  std::vector<Tensor> params;
  Options options;  // overrides of the optimizer's defaults; complete once added

  ParamGroup(std::vector<Tensor> tensors, Options overrides = {})  // NOLINT: {params, {...}}
      : params(std::move(tensors)), options(std::move(overrides)) {}

  // The named option; ember::Error when the group has no such option.
  double option(const std::string& name) const;
  double lr() const { return option("lr"); }
  void set_lr(double lr) { options["lr"] = lr; }
};

// What a checkpoint stores: named tensors and named numbers (safetensors holds the former,
// its JSON metadata the latter). Optimizers and LR schedules both produce one.
struct StateDict {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, double> scalars;
};

// The state of one parameter: how many updates it has had and its named buffers
// (each shaped like the parameter, on its device and in its dtype).
struct ParamState {
  int64_t step = 0;
  std::map<std::string, Tensor> buffers;

  bool empty() const { return step == 0 && buffers.empty(); }
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Adds parameters with their own options (missing ones come from the defaults). Every
  // parameter must be a floating-point leaf that requires grad and appear in one group only.
  void add_param_group(ParamGroup group);

  // One update of every parameter that has a gradient, under NoGradGuard.
  void step();

  // Drops the gradients (set_to_none), or zeroes them in place.
  void zero_grad(bool set_to_none = true);

  // Options may be edited here (schedules set "lr"); add parameters only via add_param_group.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const Options& defaults() const { return defaults_; }
  // The state of parameter `index` of group `group` (empty until its first update).
  const ParamState& state(size_t group, size_t index) const;
  const std::string& name() const { return name_; }

  // Keys: "type.<name>" (= 1, which optimizer wrote it), "param_groups.<g>.<option>" and
  // "param_groups.<g>.num_params" (scalars), "state.<k>.step" (scalar) and
  // "state.<k>.<buffer>" (tensors), where k numbers the parameters across all groups in
  // order, as PyTorch does. The tensors alias the live state: clone them to keep a snapshot
  // while training goes on.
  StateDict state_dict() const;
  // Restores options and state saved by state_dict() of the same kind of optimizer with the
  // same groups (same counts, same option names, buffers shaped like the parameters). A state
  // from another optimizer (AdamW's into SGD) throws ember::Error naming both. Buffers are
  // copied to each parameter's device and dtype; nothing changes when the dict does not fit.
  void load_state_dict(const StateDict& dict);

 protected:
  Optimizer(std::string name, Options defaults);

  // Throws ember::Error (naming the optimizer and the value) on an invalid option.
  virtual void check_options(const Options& options) const = 0;
  // Updates the group's parameters that have gradients; `state` runs parallel to params.
  virtual void step_group(ParamGroup& group, std::vector<ParamState>& state) = 0;

 private:
  std::string name_;
  Options defaults_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;
};

}  // namespace ember::optim

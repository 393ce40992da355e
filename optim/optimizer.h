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
//
// Device-side steps. SGD and Adam/AdamW can take what a step reads from the host on the
// device instead, as torch.optim's fused and capturable optimizers do:
// - step(StepScaling): GradScaler's 1 / scale multiplied into each gradient as the
//   multi-tensor pass reads it, and its found-inf flag deciding on the device whether the
//   update happens (GradScaler::step uses it where device_step_refusal() is empty);
// - capturable (SGDOptions / AdamOptions::capturable, or set_capturable): each group's lr
//   in a device scalar that step() refreshes from lr() where it changed, and Adam's step
//   counts on the device, so a CUDA graph that captured step() replays it correctly under an
//   LR schedule (call prepare_capturable() before each replay).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <ember/autograd/autograd.h>
#include <ember/tensor/multi_tensor.h>
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
  int64_t step = 0;  // the count while device_step is undefined
  // The count on the parameter's device (0-d i64), where steps run on the device (Adam under
  // capturable or step(StepScaling)); once defined it is the count and `step` is stale.
  Tensor device_step;
  std::map<std::string, Tensor> buffers;

  // The count: `step`, or device_step read back (which waits for the device).
  int64_t step_count() const { return device_step.defined() ? device_step.item<int64_t>() : step; }
  bool empty() const { return step == 0 && !device_step.defined() && buffers.empty(); }
};

// Loss scaling applied inside the update (GradScaler's, as the grad_scale and found_inf that
// torch's fused optimizers take), both tensors on one device.
struct StepScaling {
  Tensor inv_scale;  // 1-element f32: each gradient is multiplied by it as it is read
                     // (undefined: the gradients were unscaled already)
  Tensor found_inf;  // 1-element f32: nonzero leaves parameters, state and step counts as they are
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
  // One update with `scaling` applied on the device: nothing is read back to the host, and a
  // nonzero found_inf leaves everything as it was. ember::Error (naming why) unless
  // device_step_refusal() is empty, or when the scaling tensors are not as described.
  void step(const StepScaling& scaling);
  // Why the next step cannot run with device-side inputs alone, or "" when it can: every
  // parameter with a gradient must take the multi-tensor update and already have its state
  // (a first update creates it, SGD's momentum buffer from the gradient), and a capturable
  // Adam's step counts must be on the device.
  // A wrapper such as dist::ZeroRedundancyOptimizer gives its own answer.
  virtual std::string device_step_refusal() const;

  // Capturable: lr and step counts read on the device (see the top of this file). Turning it
  // on needs the multi-tensor update (ember::Error with foreach = false); it is an execution
  // option, in no state dict.
  bool capturable() const { return capturable_; }
  void set_capturable(bool capturable);
  // Writes every group's lr() into its device scalar where it changed since the last write
  // (step() does this first; a graph replay does not, so call this before replaying one).
  // Nothing when not capturable.
  void prepare_capturable();

  // Drops the gradients (set_to_none), or zeroes them in place.
  void zero_grad(bool set_to_none = true);

  // Options may be edited here (schedules set "lr"); add parameters only via add_param_group.
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const Options& defaults() const { return defaults_; }
  // The state of parameter `index` of group `group` (empty until its first update).
  virtual const ParamState& state(size_t group, size_t index) const;
  // Replaces that state: the step count and buffers (each shaped like the parameter, copied to
  // its device and dtype). ember::Error naming the parameter for a wrong shape or index.
  void set_state(size_t group, size_t index, const ParamState& state);
  const std::string& name() const { return name_; }

  // Keys: "type.<name>" (= 1, which optimizer wrote it), "param_groups.<g>.<option>" and
  // "param_groups.<g>.num_params" (scalars), "state.<k>.step" (scalar) and
  // "state.<k>.<buffer>" (tensors), where k numbers the parameters across all groups in
  // order, as PyTorch does. The tensors alias the live state: clone them to keep a snapshot
  // while training goes on.
  virtual StateDict state_dict() const;
  // Restores options and state saved by state_dict() of the same kind of optimizer with the
  // same groups (same counts, same option names, buffers shaped like the parameters). A state
  // from another optimizer (AdamW's into SGD) throws ember::Error naming both. Buffers are
  // copied to each parameter's device and dtype; nothing changes when the dict does not fit.
  virtual void load_state_dict(const StateDict& dict);

  // GradScaler's found-inf flags for this optimizer's gradients (one per device), before it
  // decides to step. An optimizer whose ranks each hold a shard of the gradients
  // (dist::ZeroRedundancyOptimizer under ZeRO-2) makes them agree across ranks here, so all
  // step or skip together; the default leaves them as they are.
  virtual void agree_found_inf(std::vector<std::pair<Device, Tensor>>& flags);

 protected:
  Optimizer(std::string name, Options defaults);

  // What one group's update reads on the device: the step's scaling and the group's lr
  // scalars (capturable), each null when absent.
  struct DeviceInputs {
    const StepScaling* scaling = nullptr;
    const std::vector<std::pair<Device, Tensor>>* lr = nullptr;

    bool any() const { return scaling != nullptr || lr != nullptr; }
    // The multi-tensor pass's inputs for parameters on `device` (Adam adds its steps).
    MultiTensorDeviceArgs for_device(Device device) const;
  };

  // Throws ember::Error (naming the optimizer and the value) on an invalid option.
  virtual void check_options(const Options& options) const = 0;
  // Updates the group's parameters that have gradients; `state` runs parallel to params.
  // The parameters that take the multi-tensor update read `device`'s inputs; with a scaling,
  // device_refusal said "" for the group first, so every one of them does.
  virtual void step_group(ParamGroup& group, std::vector<ParamState>& state,
                          const DeviceInputs& device) = 0;
  // Why the group cannot update from device inputs now ("" when it can); the default: the
  // optimizer has no multi-tensor update.
  virtual std::string device_refusal(const ParamGroup& group,
                                     const std::vector<ParamState>& state) const;
  // Whether the optimizer has a multi-tensor update it may use (capturable needs one).
  virtual bool has_multi_tensor_update() const { return false; }
  // step() and step(scaling) after their checks: every group's step_group. A wrapper that
  // steps another optimizer (dist::ZeroRedundancyOptimizer) replaces it.
  virtual void run_step(const StepScaling* scaling);

 private:
  std::string name_;
  Options defaults_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;
  bool capturable_ = false;
  // Capturable: per group, its lr on each device its parameters use, and the value written.
  struct DeviceLr {
    std::vector<std::pair<Device, Tensor>> scalars;
    double written = 0.0;
  };
  std::vector<DeviceLr> device_lr_;
};

}  // namespace ember::optim

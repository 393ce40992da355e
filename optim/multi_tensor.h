// How SGD and Adam/AdamW choose between the per-parameter update and the multi-tensor one
// (tensor/multi_tensor.h), from their options' `foreach` / `fused`, as torch.optim does:
//
//   foreach unset, fused false (default)  multi-tensor for CUDA parameters, per-parameter on
//                                         CPU (PyTorch's default: foreach on CUDA only)
//   foreach = true or fused = true        multi-tensor on every device
//   foreach = false                       per-parameter everywhere (the reference path)
//
// foreach = true with fused = true is refused, as PyTorch refuses it. In ember both names
// select the same single-pass update. A parameter the multi-tensor update cannot take (not
// contiguous, a gradient of another dtype, a non-contiguous state buffer) is updated by the
// per-parameter path in the same step.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "optimizer.h"

namespace ember::optim::detail {

enum class MultiTensorMode : uint8_t { kAuto, kOn, kOff };

// The mode for the options; ember::Error naming `optimizer` for foreach = true with fused.
MultiTensorMode multi_tensor_mode(const char* optimizer, std::optional<bool> foreach, bool fused);

// The base of the optimizers that have a multi-tensor update (SGD, Adam, AdamW): the mode
// their foreach / fused options chose, and the path an update takes.
class MultiTensorOptimizer : public Optimizer {
 protected:
  MultiTensorOptimizer(const char* name, Options defaults, std::optional<bool> foreach, bool fused)
      : Optimizer(name, std::move(defaults)),
        multi_tensor_(multi_tensor_mode(name, foreach, fused)) {}

  bool has_multi_tensor_update() const override { return multi_tensor_ != MultiTensorMode::kOff; }
  // The multi-tensor update on every device once capturable, else the options' choice.
  MultiTensorMode mode() const { return capturable() ? MultiTensorMode::kOn : multi_tensor_; }

 private:
  MultiTensorMode multi_tensor_;
};

// Parameters of one device and dtype that take the multi-tensor update together.
struct ParamBucket {
  Device device;
  DType dtype;
  std::vector<size_t> indices;  // into the group's params
};

struct ParamSplit {
  std::vector<ParamBucket> buckets;
  std::vector<size_t> single;  // the per-parameter path's, in order
};

// The group's parameters that have a gradient, split between the two paths. `buffers` names
// the state buffers the update reads (those present must be laid out like their parameter,
// contiguous or channels_last, for the multi-tensor path).
ParamSplit split_params(const ParamGroup& group, const std::vector<ParamState>& state,
                        MultiTensorMode mode, std::initializer_list<const char*> buffers);

// Why the group cannot update from device inputs now ("" when it can): a parameter with a
// gradient that split_params leaves to the per-parameter path, one that lacks a buffer of
// `required` (its first update creates it), or, with `device_steps`, one whose step count is
// still on the host.
std::string device_update_refusal(const ParamGroup& group, const std::vector<ParamState>& state,
                                  MultiTensorMode mode, std::initializer_list<const char*> buffers,
                                  const std::vector<const char*>& required, bool device_steps);

}  // namespace ember::optim::detail

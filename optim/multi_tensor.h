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
#include <vector>

#include "optimizer.h"

namespace ember::optim::detail {

enum class MultiTensorMode : uint8_t { kAuto, kOn, kOff };

// The mode for the options; ember::Error naming `optimizer` for foreach = true with fused.
MultiTensorMode multi_tensor_mode(const char* optimizer, std::optional<bool> foreach, bool fused);

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

}  // namespace ember::optim::detail

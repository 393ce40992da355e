#include "multi_tensor.h"

#include <algorithm>

#include <ember/tensor/multi_tensor.h>

namespace ember::optim::detail {

MultiTensorMode multi_tensor_mode(const char* optimizer, std::optional<bool> foreach, bool fused) {
  EMBER_CHECK(!(fused && foreach.value_or(false)), optimizer,
              "fused = true and foreach = true cannot be set together (as in torch.optim); "
              "either selects ember's multi-tensor update");
  if (fused || foreach.value_or(false)) return MultiTensorMode::kOn;
  return foreach.has_value() ? MultiTensorMode::kOff : MultiTensorMode::kAuto;
}

namespace {

// The pass walks memory flat: the parameter contiguous or channels_last, and its gradient
// (copied into the parameter's layout when it differs) and state of its dtype and device, the
// state laid out like it.
bool takes_multi_tensor(const Tensor& p, const ParamState& state,
                        std::initializer_list<const char*> buffers) {
  const Tensor& g = p.grad();
  if (!is_flat(p) || g.dtype() != p.dtype() || g.device() != p.device() || g.sizes() != p.sizes())
    return false;
  return std::all_of(buffers.begin(), buffers.end(), [&](const char* name) {
    const auto it = state.buffers.find(name);
    return it == state.buffers.end() ||
           (same_flat_order(it->second, p) && it->second.dtype() == p.dtype() &&
            it->second.device() == p.device());
  });
}

}  // namespace

ParamSplit split_params(const ParamGroup& group, const std::vector<ParamState>& state,
                        MultiTensorMode mode, std::initializer_list<const char*> buffers) {
  ParamSplit split;
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    if (!p.grad().defined()) continue;
    const bool multi =
        mode == MultiTensorMode::kOn || (mode == MultiTensorMode::kAuto && p.device().is_cuda());
    if (!multi || !takes_multi_tensor(p, state[i], buffers)) {
      split.single.push_back(i);
      continue;
    }
    auto it = std::find_if(split.buckets.begin(), split.buckets.end(), [&](const ParamBucket& b) {
      return b.device == p.device() && b.dtype == p.dtype();
    });
    if (it == split.buckets.end()) it = split.buckets.insert(it, {p.device(), p.dtype(), {}});
    it->indices.push_back(i);
  }
  return split;
}

std::string device_update_refusal(const ParamGroup& group, const std::vector<ParamState>& state,
                                  MultiTensorMode mode, std::initializer_list<const char*> buffers,
                                  const std::vector<const char*>& required, bool device_steps) {
  const ParamSplit split = split_params(group, state, mode, buffers);
  if (!split.single.empty()) {
    const size_t i = split.single.front();
    const char* why = mode == MultiTensorMode::kOff ? "foreach = false"
                      : mode == MultiTensorMode::kAuto && group.params[i].device().is_cpu()
                          ? "foreach unset on the CPU"
                          : "its tensors are not laid out for the pass";
    return ember::detail::str_cat("parameter ", i, " takes the per-parameter update (", why, ")");
  }
  for (size_t i = 0; i < group.params.size(); ++i) {
    if (!group.params[i].grad().defined()) continue;
    for (const char* name : required) {
      if (state[i].buffers.count(name) == 0)
        return ember::detail::str_cat("parameter ", i, " has no ", name,
                                      " yet (its first update creates it)");
    }
    if (device_steps && !state[i].empty() && !state[i].device_step.defined())
      return ember::detail::str_cat("parameter ", i,
                                    "'s step count is on the host (an eager step moves it)");
  }
  return "";
}

}  // namespace ember::optim::detail

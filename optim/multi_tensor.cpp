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

}  // namespace ember::optim::detail

#include "clip_grad.h"

#include <algorithm>
#include <cmath>

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/multi_tensor.h>
#include <ember/tensor/ops.h>

namespace ember::optim {

namespace {

// Tensors of one device and dtype that the multi-tensor passes take together, and the rest.
struct Split {
  std::vector<std::vector<Tensor>> buckets;
  std::vector<Tensor> single;
  bool empty() const { return buckets.empty() && single.empty(); }
  const Tensor& first() const { return buckets.empty() ? single.front() : buckets.front().front(); }
};

Split split(const std::vector<Tensor>& tensors, std::optional<bool> foreach) {
  Split s;
  for (const Tensor& t : tensors) {
    if (!t.defined()) continue;
    if (!(foreach.value_or(t.device().is_cuda()) && is_flat(t))) {
      s.single.push_back(t);
      continue;
    }
    auto it = std::find_if(s.buckets.begin(), s.buckets.end(), [&](const auto& b) {
      return b.front().device() == t.device() && b.front().dtype() == t.dtype();
    });
    if (it == s.buckets.end()) it = s.buckets.insert(it, std::vector<Tensor>{});
    it->push_back(t);
  }
  return s;
}

std::vector<Tensor> grads_of(const std::vector<Tensor>& params) {
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    if (p.defined() && p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

void check_norm_type(const char* op, double norm_type) {
  EMBER_CHECK(norm_type > 0.0, op, "norm_type must be > 0, got ", norm_type);
}

}  // namespace

Tensor get_total_norm(const std::vector<Tensor>& tensors, double norm_type,
                      std::optional<bool> foreach) {
  check_norm_type("get_total_norm", norm_type);
  NoGradGuard no_grad;
  const Split s = split(tensors, foreach);
  if (s.empty()) return scalar_tensor(0.0, kF32);
  const Device device = s.first().device();
  const DType dtype = s.first().dtype();
  std::vector<Tensor> norms;
  for (const auto& b : s.buckets)
    norms.push_back(multi_tensor_norm(b, norm_type).to(device, dtype));
  for (const Tensor& t : s.single) norms.push_back(norm(t, norm_type).to(device, dtype));
  return norms.size() == 1 ? norms.front() : norm(stack(norms), norm_type);
}

void clip_grads_with_norm_(const std::vector<Tensor>& params, double max_norm,
                           const Tensor& total_norm, std::optional<bool> foreach) {
  EMBER_CHECK(max_norm >= 0.0, "clip_grads_with_norm_", "max_norm must be >= 0, got ", max_norm);
  EMBER_CHECK(total_norm.defined() && total_norm.numel() == 1, "clip_grads_with_norm_",
              "total_norm must be a one-element tensor");
  NoGradGuard no_grad;
  const Split s = split(grads_of(params), foreach);
  if (s.empty()) return;
  const Tensor coef = clamp(max_norm / add(total_norm, 1e-6), {}, 1.0);
  for (const auto& b : s.buckets)
    multi_tensor_mul_(b, coef.to(b.front().device(), b.front().dtype()));
  for (const Tensor& g : s.single) Tensor(g).mul_(coef.to(g.device(), g.dtype()));
}

Tensor clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type,
                       std::optional<bool> foreach) {
  check_norm_type("clip_grad_norm_", norm_type);
  EMBER_CHECK(max_norm >= 0.0, "clip_grad_norm_", "max_norm must be >= 0, got ", max_norm);
  // Under ZeRO-2 a rank holds its own share of the gradients: their norm is not the model's.
  for (size_t i = 0; i < params.size(); ++i) {
    const AutogradMeta* meta = params[i].defined() ? params[i].autograd_meta() : nullptr;
    EMBER_CHECK(meta == nullptr || meta->grad.defined() || meta->grad_held_by_rank < 0,
                "clip_grad_norm_", "parameter ", i, "'s gradient is held by rank ",
                meta == nullptr ? -1 : meta->grad_held_by_rank,
                " alone (ZeRO-2, ZeroRedundancyOptimizer::shard_gradients), so this rank's ",
                "gradients give another norm than the model's; clip with the optimizer's ",
                "clip_grad_norm_(max_norm, norm_type), which takes the global norm");
  }
  const Tensor total = get_total_norm(grads_of(params), norm_type, foreach);
  clip_grads_with_norm_(params, max_norm, total, foreach);
  return total;
}

}  // namespace ember::optim

#include "sync_batch_norm.h"

#include <tuple>

#include <ember/autograd/function.h>
#include <ember/tensor/grad_mode.h>

#include "detail/default_group.h"
#include "init.h"
#include "join.h"

namespace ember::dist {

SyncBatchNorm::SyncBatchNorm(int64_t num_features, std::shared_ptr<ProcessGroup> group, double eps,
                             double momentum, bool affine, bool track_running_stats)
    : nn::BatchNorm(num_features, 2, 5, eps, momentum, affine, track_running_stats),
      group_(std::move(group)) {
  EMBER_CHECK(group_ != nullptr, "SyncBatchNorm", "the process group is null");
}

SyncBatchNorm::SyncBatchNorm(int64_t num_features, double eps, double momentum, bool affine,
                             bool track_running_stats)
    : nn::BatchNorm(num_features, 2, 5, eps, momentum, affine, track_running_stats) {}

std::shared_ptr<ProcessGroup> SyncBatchNorm::group() const {
  return group_ != nullptr ? group_ : detail::default_group_for("SyncBatchNorm");
}

Tensor SyncBatchNorm::forward(const Tensor& input) {
  check_input(input);
  if (!is_training()) return nn::BatchNorm::forward(input);  // running (or local) statistics
  // Without a group of its own and with no default group: this rank's batch, as PyTorch.
  if (group_ == nullptr && !is_initialized()) return nn::BatchNorm::forward(input);
  const std::shared_ptr<ProcessGroup> group = this->group();
  // A group of one has nothing to share: batch norm itself, as PyTorch's SyncBatchNorm does
  // (and so twice differentiable).
  if (group->size() == 1) return nn::BatchNorm::forward(input);
  const double momentum = effective_momentum();
  const int64_t n = input.size(0), channels = input.size(1);
  const int64_t spatial = input.dim() > 2 ? input.numel() / std::max<int64_t>(n * channels, 1) : 1;
  const DType stat = input.dtype() == kF16 || input.dtype() == kBF16 ? kF32 : input.dtype();
  const Shape per_channel{1, channels, 1};
  ProcessGroup& pg = *group;
  const bool input_grad = input.requires_grad();
  // A channels_last input gives a channels_last output (and input gradient), as BatchNorm does.
  const MemoryFormat layout =
      input.dim() == 4 && !input.is_contiguous() && input.is_contiguous(MemoryFormat::ChannelsLast)
          ? MemoryFormat::ChannelsLast
          : MemoryFormat::Contiguous;
  Tensor w = weight, b = bias;
  // Under a Join each collective is announced first, for the ranks that joined to shadow.
  std::shared_ptr<detail::JoinChannel> join = join_ && join_->announcing() ? join_ : nullptr;
  using JoinOp = detail::JoinChannel::Op;

  // What backward needs, filled in by forward.
  auto xhat = std::make_shared<Tensor>();
  auto invstd = std::make_shared<Tensor>();
  auto total = std::make_shared<double>(0.0);

  auto forward_fn = [&]() -> std::vector<Tensor> {
    const Tensor x = input.contiguous().reshape({n, channels, spatial}).to(stat);
    const int64_t count = n * spatial;
    Tensor mean = count > 0 ? x.mean({0, 2}) : zeros({channels}, x.options());
    Tensor m2 = count > 0 ? (x - mean.view(per_channel)).pow(2).sum({0, 2})
                          : zeros({channels}, x.options());
    const TensorOptions f64(kF64, input.device());
    Tensor packed = cat({mean.to(kF64), m2.to(kF64), full({1}, static_cast<double>(count), f64)});
    std::vector<Tensor> all{packed};
    if (pg.size() > 1) {
      all.clear();
      for (int r = 0; r < pg.size(); ++r) all.push_back(empty(packed.sizes(), f64));
      if (join && join->announcing()) join->announce(JoinOp::kAllgather, packed);
      pg.allgather(all, packed)->wait();
    }
    // Chan's combination of per-rank (count, mean, M2).
    const Tensor table = stack(all);  // [world, 2C + 1]
    const Tensor counts = table.narrow(1, 2 * channels, 1);
    const Tensor means = table.narrow(1, 0, channels);
    const Tensor m2s = table.narrow(1, channels, channels);
    *total = counts.sum().item<double>();
    EMBER_CHECK(*total > 1, name(), "expected more than 1 value per channel over all ranks, got ",
                *total, " (local input ", shape_str(input.sizes()), ")");
    const Tensor global_mean = (means * counts).sum({0}) / *total;
    const Tensor global_m2 = (m2s + counts * (means - global_mean.unsqueeze(0)).pow(2)).sum({0});
    if (running_mean.defined()) {
      running_mean.mul_(1.0 - momentum).add_(global_mean.to(running_mean.dtype()), momentum);
      running_var.mul_(1.0 - momentum)
          .add_((global_m2 / (*total - 1.0)).to(running_var.dtype()), momentum);
    }
    *invstd = (global_m2 / *total + eps()).rsqrt().to(stat);
    *xhat = (x - global_mean.to(stat).view(per_channel)) * invstd->view(per_channel);
    Tensor y = *xhat;
    if (w.defined()) y = y * w.to(stat).view(per_channel);
    if (b.defined()) y = y + b.to(stat).view(per_channel);
    return {y.to(input.dtype()).reshape(input.sizes()).contiguous(layout)};
  };

  auto backward_fn = [xhat, invstd, total, w, b, input_grad, group, join, n, channels, spatial,
                      stat, per_channel, layout, in_sizes = input.sizes(),
                      in_dtype = input.dtype()](const std::vector<Tensor>& grads) {
    std::vector<Tensor> out(3);
    if (!grads[0].defined()) return out;
    const Tensor dy = grads[0].contiguous().reshape({n, channels, spatial}).to(stat);
    const Tensor sum_dy = dy.sum({0, 2});
    const Tensor sum_dy_xhat = (dy * *xhat).sum({0, 2});
    // Weight and bias: this rank's share (DDP averages them across ranks).
    if (w.defined()) out[1] = sum_dy_xhat.to(w.dtype());
    if (b.defined()) out[2] = sum_dy.to(b.dtype());
    if (input_grad) {
      Tensor packed = cat({sum_dy, sum_dy_xhat});
      if (group->size() > 1) {
        if (join && join->announcing()) join->announce(JoinOp::kAllreduce, packed);
        group->allreduce(packed, ReduceOp::kSum)->wait();
      }
      const Tensor mean_dy = packed.narrow(0, 0, channels) / *total;
      const Tensor mean_dy_xhat = packed.narrow(0, channels, channels) / *total;
      Tensor scale = *invstd;
      if (w.defined()) scale = scale * w.to(stat);
      const Tensor dx = (dy - mean_dy.view(per_channel) - *xhat * mean_dy_xhat.view(per_channel)) *
                        scale.view(per_channel);
      out[0] = dx.to(in_dtype).reshape(in_sizes).contiguous(layout);
    }
    return out;
  };

  // The statistics crossed the ranks without history: a second backward through these
  // gradients is refused, as PyTorch's SyncBatchNorm backward has no derivative either.
  return autograd::apply_function("SyncBatchNormBackward", {input, weight, bias}, forward_fn,
                                  backward_fn, autograd::Differentiability::kOnce)[0];
}

namespace {

// convert_sync_batchnorm's work; a null `group` makes SyncBatchNorms over the default group.
std::shared_ptr<nn::Module> convert_to_sync(std::shared_ptr<nn::Module> module,
                                            const std::shared_ptr<ProcessGroup>& group) {
  EMBER_CHECK(module != nullptr, "convert_sync_batchnorm", "the module is null");
  // The replacement shares the BatchNorm's tensors (as PyTorch's does), so optimizers and
  // other holders of the parameters stay valid.
  auto convert = [&group](nn::Module& m) -> std::shared_ptr<nn::Module> {
    auto* bn = dynamic_cast<nn::BatchNorm*>(&m);
    if (bn == nullptr || dynamic_cast<SyncBatchNorm*>(&m) != nullptr) return nullptr;
    const bool affine = bn->weight.defined(), tracked = bn->running_mean.defined();
    auto sync = group != nullptr
                    ? std::make_shared<SyncBatchNorm>(bn->num_features(), group, bn->eps(),
                                                      bn->momentum(), affine, tracked)
                    : std::make_shared<SyncBatchNorm>(bn->num_features(), bn->eps(), bn->momentum(),
                                                      affine, tracked);
    if (bn->weight.defined()) {
      sync->weight = sync->parameter("weight") = bn->weight;
      sync->bias = sync->parameter("bias") = bn->bias;
    }
    if (bn->running_mean.defined()) {
      sync->running_mean = sync->buffer("running_mean") = bn->running_mean;
      sync->running_var = sync->buffer("running_var") = bn->running_var;
      sync->num_batches_tracked = sync->buffer("num_batches_tracked") = bn->num_batches_tracked;
    }
    sync->train(bn->is_training());
    return sync;
  };
  if (auto root = convert(*module)) return root;
  // All replacements are found before any is made: a replaced module may be freed.
  std::vector<std::tuple<nn::Module*, std::string, std::shared_ptr<nn::Module>>> replacements;
  for (auto& [path, m] : module->named_modules()) {
    for (const auto& [child_name, child] : m->named_children()) {
      if (auto sync = convert(*child)) replacements.emplace_back(m, child_name, std::move(sync));
    }
  }
  for (auto& [parent, child_name, sync] : replacements) parent->replace_module(child_name, sync);
  return module;
}

}  // namespace

std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module,
                                                   std::shared_ptr<ProcessGroup> group) {
  EMBER_CHECK(group != nullptr, "convert_sync_batchnorm", "the process group is null");
  return convert_to_sync(std::move(module), group);
}

std::shared_ptr<nn::Module> convert_sync_batchnorm(std::shared_ptr<nn::Module> module) {
  return convert_to_sync(std::move(module), nullptr);
}

}  // namespace ember::dist

#include "schedule.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <ember/tensor/error.h>

namespace ember::apps {

SchedulePlan plan_schedule(const TrainOptions& o, int64_t steps_per_epoch) {
  EMBER_CHECK(steps_per_epoch > 0, "ember-train schedule", "steps_per_epoch = ", steps_per_epoch,
              " (the training split holds no full batch)");
  SchedulePlan plan;
  plan.total_steps = o.epochs * steps_per_epoch;
  if (o.max_steps > 0) plan.total_steps = std::min(plan.total_steps, o.max_steps);
  int64_t warmup = 0;
  if (o.warmup_steps >= 0) {
    warmup = o.warmup_steps;
  } else if (o.warmup_epochs >= 0) {
    warmup = std::llround(o.warmup_epochs * static_cast<double>(steps_per_epoch));
  } else if (o.schedule == "onecycle") {
    warmup = std::llround(kMaxWarmupFraction * static_cast<double>(plan.total_steps));
  } else {
    warmup = steps_per_epoch;
  }
  const auto cap = static_cast<int64_t>(kMaxWarmupFraction * static_cast<double>(plan.total_steps));
  plan.warmup_capped = warmup > cap;
  plan.warmup_steps = std::min(warmup, cap);
  const bool default_fraction = plan.warmup_capped || (o.warmup_steps < 0 && o.warmup_epochs < 0);
  if (o.schedule == "onecycle") {
    // OneCycleLR's phases need two steps up and one down (with fewer its formula divides
    // by zero, as PyTorch's does); a run of under 3 steps stays at the peak instead.
    plan.warmup_steps =
        plan.total_steps < 3 ? 0 : std::clamp<int64_t>(plan.warmup_steps, 2, plan.total_steps - 1);
    const double total = static_cast<double>(plan.total_steps);
    plan.pct_start = default_fraction && kMaxWarmupFraction * total >= 2
                         ? kMaxWarmupFraction
                         : static_cast<double>(plan.warmup_steps) / total;
  }
  return plan;
}

std::unique_ptr<optim::LRScheduler> make_schedule(const std::string& kind,
                                                  optim::Optimizer& optimizer, double peak_lr,
                                                  const SchedulePlan& plan) {
  const int64_t total = plan.total_steps, warmup = plan.warmup_steps;
  EMBER_CHECK(total > 0 && warmup >= 0 && warmup < total, "ember-train schedule",
              "total_steps = ", total, ", warmup_steps = ", warmup);
  for (optim::ParamGroup& group : optimizer.param_groups()) group.set_lr(peak_lr);
  if (kind == "onecycle" && total >= 3) {
    EMBER_CHECK(warmup >= 2 && warmup < total, "ember-train schedule",
                "onecycle needs 2 <= warmup_steps < total_steps, got ", warmup, " of ", total);
    optim::OneCycleOptions options;
    options.pct_start = plan.pct_start;
    // Momentum (SGD's, when it has some) or Adam's beta1 cycles against the lr.
    const optim::Options& group = optimizer.param_groups().front().options;
    options.cycle_momentum =
        group.count("beta1") > 0 || (group.count("momentum") > 0 && group.at("momentum") > 0);
    return std::make_unique<optim::OneCycleLR>(optimizer, peak_lr, total, options);
  }
  if (kind == "warmup-cosine") {  // nanoGPT's: from 0 up, then down to peak / 10
    return std::make_unique<optim::CosineWithWarmupLR>(optimizer, warmup, total, peak_lr / 10);
  }
  std::unique_ptr<optim::LRScheduler> after;
  if (kind == "cosine") {
    after = std::make_unique<optim::CosineAnnealingLR>(optimizer, total - warmup);
  } else if (kind == "step") {
    after = std::make_unique<optim::MultiStepLR>(
        optimizer, std::vector<int64_t>{total / 2 - warmup, total * 3 / 4 - warmup}, 0.1);
  } else {
    EMBER_CHECK(kind == "constant" || kind == "onecycle", "ember-train schedule",
                "unknown schedule '", kind,
                "' (onecycle, cosine, warmup-cosine, step or constant)");
  }
  if (warmup == 0) {
    if (after) return after;
    return std::make_unique<optim::LambdaLR>(optimizer, [](int64_t) { return 1.0; });
  }
  return after ? std::make_unique<optim::LinearWarmup>(std::move(after), warmup)
               : std::make_unique<optim::LinearWarmup>(optimizer, warmup);
}

}  // namespace ember::apps

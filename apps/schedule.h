// ember-train's learning-rate schedule, laid out over the run's real optimizer steps.
#pragma once

#include <cstdint>
#include <memory>

#include <ember/optim/lr_scheduler.h>

#include "train_options.h"

namespace ember::apps {

// Warm-up never takes more than this fraction of the run: PyTorch's OneCycleLR default
// (pct_start = 0.3), which leaves 70% of the steps to decay, so a short run (one epoch, a
// --max-steps smoke run) still warms up and anneals instead of ending at its peak lr.
inline constexpr double kMaxWarmupFraction = 0.3;

struct SchedulePlan {
  int64_t total_steps = 0;     // optimizer steps in the run
  int64_t warmup_steps = 0;    // of those, rising to the peak lr
  bool warmup_capped = false;  // the asked-for warm-up was longer than kMaxWarmupFraction
  // onecycle's pct_start: exactly kMaxWarmupFraction (PyTorch's default) when the warm-up
  // is the default or capped, else warmup_steps / total_steps.
  double pct_start = 0;
};

// total_steps = epochs x steps_per_epoch, or --max-steps when that is smaller. Warm-up is
// --warmup-steps, else --warmup-epochs x steps_per_epoch, else 30% of the run (onecycle) or
// one epoch (the others); then capped to kMaxWarmupFraction of total_steps (onecycle: at
// least 2 steps, and none in a run of under 3).
SchedulePlan plan_schedule(const TrainOptions& options, int64_t steps_per_epoch);

// The schedule for `plan`, stepped once per optimizer step; peak_lr is the lr after warm-up.
//   onecycle: OneCycleLR(peak_lr, total_steps, plan.pct_start), PyTorch's
//             defaults otherwise (from peak/25 up, cosine down to peak/25e4, momentum cycled
//             0.95 -> 0.85 -> 0.95 for SGD); the peak is at step pct_start x total - 1.
//             It needs warmup >= 2 and a step after it (plan_schedule sees to that); a
//             run of under 3 steps keeps the peak lr.
//   cosine:   LinearLR(1/3 -> 1 over warmup), then CosineAnnealingLR to 0 at total_steps.
//   warmup-cosine: nanoGPT's CosineWithWarmupLR: linear from 0 over warmup, then cosine
//             down to peak_lr / 10 at total_steps (ember-train --model gpt's default).
//   step:     the same warm-up, then x0.1 at 50% and 75% of the run.
//   constant: the same warm-up, then peak_lr.
std::unique_ptr<optim::LRScheduler> make_schedule(const std::string& kind,
                                                  optim::Optimizer& optimizer, double peak_lr,
                                                  const SchedulePlan& plan);

}  // namespace ember::apps

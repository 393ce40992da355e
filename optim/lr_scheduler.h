// Learning-rate schedules (torch.optim.lr_scheduler's model).
//
// A schedule is built on an optimizer and, like PyTorch's, applies its step-0 learning rates
// at construction; each step() then advances one step (an epoch or an iteration, as the
// caller uses it) and writes the new learning rate into every param group's "lr". The
// schedules here are closed forms of the step count and the base learning rates (each
// group's lr when the schedule was built), so they are exact however long they run and
// resume exactly from state_dict(); they overwrite, rather than chain onto, a group's lr.
// To compose a warmup with another schedule, wrap it in LinearWarmup.
//
//   optim::SGD sgd(params, {.lr = 0.1, .momentum = 0.9});
//   optim::LinearWarmup schedule(std::make_unique<optim::CosineAnnealingLR>(sgd, 95), 5, 0.1);
//   for (int epoch = 0; epoch < 100; ++epoch) { train_epoch(sgd); schedule.step(); }
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "optimizer.h"

namespace ember::optim {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  // Advances one step and writes the new learning rates into the optimizer.
  void step();
  // The learning rates step() (or construction) last wrote, one per param group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  // How many times step() has run (0 right after construction).
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }

  // The learning rate of every group at step `epoch`.
  virtual std::vector<double> lr_at(int64_t epoch) const = 0;

  // Scalars "last_epoch", "base_lrs.<g>" and "last_lr.<g>". The schedule's configuration
  // (step sizes, milestones, ...) is the constructor's; only progress is saved.
  StateDict state_dict() const;
  // Restores the progress and writes that step's hyper-parameters into the optimizer.
  void load_state_dict(const StateDict& dict);

 protected:
  // Captures every group's current lr as its base lr; `name` appears in error messages.
  LRScheduler(const char* name, Optimizer& optimizer);
  // Derived constructors call this last: applies step 0, as PyTorch's constructors do.
  void start();
  // Writes the hyper-parameters of step `epoch` into the optimizer (by default the lrs).
  virtual void apply(int64_t epoch);
  void set_lrs(const std::vector<double>& lrs);
  const char* name() const { return name_; }

  std::vector<double> base_lrs_;

 private:
  friend class LinearWarmup;  // drives the schedule it wraps
  const char* name_;
  Optimizer& optimizer_;
  int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

// lr = base_lr * gamma^floor(epoch / step_size).
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::vector<double> lr_at(int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base_lr * gamma^(number of milestones <= epoch); a repeated milestone counts twice.
class MultiStepLR : public LRScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  std::vector<double> lr_at(int64_t epoch) const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / t_max)) / 2; past t_max the
// cosine continues (rising again), as PyTorch's does.
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  std::vector<double> lr_at(int64_t epoch) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

struct OneCycleOptions {
  enum class Anneal { kCos, kLinear };
  double pct_start = 0.3;  // fraction of the steps spent raising the lr
  Anneal anneal_strategy = Anneal::kCos;
  double div_factor = 25.0;       // initial lr = max_lr / div_factor
  double final_div_factor = 1e4;  // final lr = initial lr / final_div_factor
  bool three_phase = false;       // back to the initial lr before annealing to the final
  bool cycle_momentum = true;     // momentum (SGD) or beta1 (Adam) moves against the lr
  double base_momentum = 0.85;
  double max_momentum = 0.95;
};

// The 1cycle policy (torch.optim.lr_scheduler.OneCycleLR, its defaults included): the lr
// rises from max_lr / div_factor to max_lr over pct_start of total_steps, then anneals to
// the final lr; with cycle_momentum the group's "momentum" (SGD) or "beta1" (Adam, AdamW)
// moves the other way between max_momentum and base_momentum. The optimizer's own lr is
// replaced. The final lr is reached at step total_steps - 1; as in PyTorch one more step is
// allowed, and stepping past total_steps throws ember::Error.
class OneCycleLR : public LRScheduler {
 public:
  // One max_lr per group, or a single one for all groups.
  OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
             OneCycleOptions options = {});
  OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
             OneCycleOptions options = {});
  std::vector<double> lr_at(int64_t epoch) const override;
  // The momentum (or beta1) of step `epoch`, the same for every group.
  double momentum_at(int64_t epoch) const;

 protected:
  void apply(int64_t epoch) override;

 private:
  enum LrPoint { kInitialLr, kMaxLr, kMinLr };
  struct Phase {
    double end_step;
    LrPoint start_lr, end_lr;
    double start_momentum, end_momentum;
  };
  // The phase holding `epoch` and how far into it epoch is (0 to 1).
  std::pair<const Phase*, double> locate(int64_t epoch) const;
  double anneal(double start, double end, double pct) const;

  std::vector<double> max_lrs_;
  std::vector<double> min_lrs_;  // the initial lrs are base_lrs_
  int64_t total_steps_;
  OneCycleOptions options_;
  std::vector<Phase> phases_;
  std::string momentum_key_;  // "momentum" or "beta1"; empty without cycle_momentum
};

// Linear warmup composed with another schedule: for the first warmup_steps steps the lr
// rises linearly from start_factor times the wrapped schedule's step-0 lr to that lr
// (PyTorch's LinearLR); from then on the wrapped schedule runs from its own step 0, as
// SequentialLR([LinearLR(start_factor, total_iters=warmup_steps), after], [warmup_steps]).
class LinearWarmup : public LRScheduler {
 public:
  // Drives `after`'s optimizer; `after` (not yet stepped) belongs to the warmup from now on.
  // During the warmup only the lr moves (a wrapped OneCycleLR's momentum stays at its step 0).
  LinearWarmup(std::unique_ptr<LRScheduler> after, int64_t warmup_steps,
               double start_factor = 1.0 / 3.0);
  // Warmup to the optimizer's lrs, which then stay constant.
  LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor = 1.0 / 3.0);
  std::vector<double> lr_at(int64_t epoch) const override;

 protected:
  void apply(int64_t epoch) override;

 private:
  std::unique_ptr<LRScheduler> after_;
  int64_t warmup_steps_;
  double start_factor_;
};

}  // namespace ember::optim

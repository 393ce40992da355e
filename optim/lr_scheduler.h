// Learning-rate schedules (torch.optim.lr_scheduler's model, defaults included).
//
// A schedule is built on an optimizer and, like PyTorch's, applies its step-0 learning rates
// at construction; each step() then advances one step (an epoch or an iteration, as the
// caller uses it) and writes the new learning rate into every param group's "lr". Apart
// from ReduceLROnPlateau, which follows a metric, the schedules are closed forms of the step
// count and the base learning rates, so they are exact however long they run and resume
// exactly from state_dict(); each one overwrites a group's lr rather than chaining onto it.
//
// Composing: SequentialLR runs schedules one after another (LinearWarmup is its common
// case); ChainedScheduler multiplies the factors of schedules of the form
// lr = base_lr * factor(step) (FactorScheduler), which is what PyTorch's ChainedScheduler
// computes for them. Schedules built on one optimizer share their base lrs as PyTorch's
// group["initial_lr"] makes them: the lrs before the first of them was built.
//
//   optim::SGD sgd(params, {.lr = 0.1, .momentum = 0.9});
//   std::vector<std::unique_ptr<optim::LRScheduler>> parts;
//   parts.push_back(std::make_unique<optim::LinearLR>(sgd, 0.1, 1.0, 5));
//   parts.push_back(std::make_unique<optim::CosineAnnealingLR>(sgd, 95));
//   optim::SequentialLR schedule(sgd, std::move(parts), {5});
//   for (int epoch = 0; epoch < 100; ++epoch) { train_epoch(sgd); schedule.step(); }
#pragma once

#include <cstdint>
#include <functional>
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
  virtual void step();
  // The learning rates step() (or construction) last wrote, one per param group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  // How many times step() has run (0 right after construction).
  int64_t last_epoch() const { return last_epoch_; }
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  Optimizer& optimizer() const { return optimizer_; }
  // The class name ("StepLR", ...), as error messages and state_dict() name it.
  const char* name() const { return name_; }

  // The learning rate of every group at step `epoch`.
  virtual std::vector<double> lr_at(int64_t epoch) const = 0;

  // Scalars "type.<name>" (1), "last_epoch", "base_lrs.<g>", "last_lr.<g>", and what the
  // schedule adds (a composite's children under "schedulers.<i>.", ReduceLROnPlateau's
  // counters). The configuration (step sizes, milestones, lambdas) is the constructor's;
  // only progress is saved.
  StateDict state_dict() const;
  // Restores the progress saved by state_dict() of a schedule of the same type and
  // configuration over as many groups, and writes that step's hyper-parameters into the
  // optimizer; nothing changes when the dict does not fit (ember::Error naming both types
  // when it holds another schedule's state).
  void load_state_dict(const StateDict& dict);

 protected:
  // Captures every group's current lr as its base lr; `name` appears in error messages.
  LRScheduler(const char* name, Optimizer& optimizer);
  // Derived constructors call this last: applies step 0, as PyTorch's constructors do.
  void start();
  // Writes the hyper-parameters of step `epoch` into the optimizer (by default the lrs).
  virtual void apply(int64_t epoch);
  void set_lrs(const std::vector<double>& lrs);
  // Notes that step `epoch` is the current one and what the groups' lrs now are.
  void record(int64_t epoch);

  // Extra scalars of state_dict() beyond the common ones.
  virtual void save_extra(StateDict& /*dict*/) const {}
  // Returns to step `epoch` of a dict whose keys match state_dict()'s (base_lrs_ already
  // loaded); by default applies that step.
  virtual void restore(const StateDict& /*dict*/, int64_t epoch) { apply(epoch); }
  // Sets the base lrs (a composite passes its shared initial lrs on to its children).
  virtual void rebase(const std::vector<double>& lrs) { base_lrs_ = lrs; }
  // Whether, as PyTorch's OneCycleLR does, the schedule sets group["initial_lr"] itself
  // rather than taking the lrs it was built on.
  virtual bool sets_initial_lr() const { return false; }

  // For composites: checks that `children` are non-null, unstepped and on `optimizer`.
  static void check_children(const char* composite,
                             const std::vector<std::unique_ptr<LRScheduler>>& children,
                             const Optimizer& optimizer);
  // Gives `children` (built one after another) their base lrs as PyTorch's
  // group["initial_lr"] does and returns the initial lrs after the last of them.
  static std::vector<double> adopt_initial_lrs(const std::vector<LRScheduler*>& children);

  std::vector<double> base_lrs_;

 private:
  friend class SequentialLR;
  friend class ChainedScheduler;

  const char* name_;
  Optimizer& optimizer_;
  uint64_t order_;                 // construction order across all schedules
  std::vector<double> found_lrs_;  // the groups' lrs when this schedule was built
  int64_t last_epoch_ = 0;
  std::vector<double> last_lr_;
};

// A schedule of the form lr = base_lr * factor(epoch), where PyTorch's chainable form
// multiplies the group's lr by factor(epoch) / factor(epoch - 1): these compose in
// ChainedScheduler by multiplying their factors.
class FactorScheduler : public LRScheduler {
 public:
  // The factor of every group at step `epoch`.
  virtual std::vector<double> factors_at(int64_t epoch) const = 0;
  std::vector<double> lr_at(int64_t epoch) const final;

 protected:
  using LRScheduler::LRScheduler;
};

// lr = base_lr * gamma^floor(epoch / step_size).
class StepLR : public FactorScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::vector<double> factors_at(int64_t epoch) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = base_lr * gamma^(number of milestones <= epoch); a repeated milestone counts twice.
class MultiStepLR : public FactorScheduler {
 public:
  MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma = 0.1);
  std::vector<double> factors_at(int64_t epoch) const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr = base_lr * gamma^epoch.
class ExponentialLR : public FactorScheduler {
 public:
  ExponentialLR(Optimizer& optimizer, double gamma);
  std::vector<double> factors_at(int64_t epoch) const override;

 private:
  double gamma_;
};

// lr = base_lr * factor until step total_iters, base_lr from then on.
class ConstantLR : public FactorScheduler {
 public:
  explicit ConstantLR(Optimizer& optimizer, double factor = 1.0 / 3.0, int64_t total_iters = 5);
  std::vector<double> factors_at(int64_t epoch) const override;

 private:
  double factor_;
  int64_t total_iters_;
};

// lr = base_lr * (start_factor + (end_factor - start_factor) * min(epoch, total_iters) /
// total_iters): a linear ramp, then constant.
class LinearLR : public FactorScheduler {
 public:
  explicit LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3.0, double end_factor = 1.0,
                    int64_t total_iters = 5);
  std::vector<double> factors_at(int64_t epoch) const override;

 private:
  double start_factor_;
  double end_factor_;
  int64_t total_iters_;
};

// lr = base_lr * (1 - min(epoch, total_iters) / total_iters)^power: 0 from total_iters on.
class PolynomialLR : public FactorScheduler {
 public:
  explicit PolynomialLR(Optimizer& optimizer, int64_t total_iters = 5, double power = 1.0);
  std::vector<double> factors_at(int64_t epoch) const override;

 private:
  int64_t total_iters_;
  double power_;
};

// A factor of the step number, as torch's lr_lambda.
using LrLambda = std::function<double(int64_t)>;

// lr = base_lr * lambda(1) * ... * lambda(epoch) (PyTorch's MultiplicativeLR, which multiplies
// the lr by lambda(epoch) at each step). One lambda for all groups or one per group. In a
// SequentialLR it may only come first: PyTorch's continues from the previous schedule's lr.
class MultiplicativeLR : public FactorScheduler {
 public:
  MultiplicativeLR(Optimizer& optimizer, LrLambda lr_lambda);
  MultiplicativeLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas);
  std::vector<double> factors_at(int64_t epoch) const override;

 private:
  std::vector<LrLambda> lambdas_;
  // The products up to cached_epoch_, so stepping along costs one call per step.
  mutable int64_t cached_epoch_ = 0;
  mutable std::vector<double> cached_;
};

// lr = base_lr * lambda(epoch); one lambda for all groups or one per group. Not a
// FactorScheduler: PyTorch's LambdaLR overwrites the lr, so it does not chain.
class LambdaLR : public LRScheduler {
 public:
  LambdaLR(Optimizer& optimizer, LrLambda lr_lambda);
  LambdaLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas);
  std::vector<double> lr_at(int64_t epoch) const override;

 private:
  std::vector<LrLambda> lambdas_;
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
  void rebase(const std::vector<double>& /*lrs*/) override {}  // its initial lrs are its own
  bool sets_initial_lr() const override { return true; }

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

// Schedules one after another (PyTorch's SequentialLR): schedule 0 runs from step 0, and
// schedule i from step milestones[i - 1] on, starting there from its own step 0. The
// children's base lrs are PyTorch's initial_lr: the optimizer's lrs before the first child
// was built (after a OneCycleLR, its initial lr max_lr / div_factor). Children must be
// unstepped, on `optimizer`, and simple schedules: not ReduceLROnPlateau or a composite.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::unique_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  std::vector<double> lr_at(int64_t epoch) const override;
  size_t size() const { return schedulers_.size(); }
  const LRScheduler& scheduler(size_t i) const { return *schedulers_.at(i); }

 protected:
  // For LinearWarmup: its name, on the children's optimizer.
  SequentialLR(const char* name, std::vector<std::unique_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  void apply(int64_t epoch) override;
  void save_extra(StateDict& dict) const override;
  void restore(const StateDict& dict, int64_t epoch) override;

 private:
  void init();
  // The child running at `epoch` and the step it is at.
  std::pair<size_t, int64_t> locate(int64_t epoch) const;

  std::vector<std::unique_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

// Several FactorSchedulers applied together (PyTorch's ChainedScheduler of them):
// lr = base_lr * factor_0(epoch) * factor_1(epoch) * ..., where base_lr is the optimizer's
// lr before the first of them was built. PyTorch chains by multiplying the group's lr with
// each schedule's step ratio, which is the same product. Schedules PyTorch chains
// differently (LambdaLR, CosineAnnealingLR, OneCycleLR, SequentialLR, ReduceLROnPlateau)
// are refused with ember::Error. Children must be unstepped and on one optimizer.
class ChainedScheduler : public FactorScheduler {
 public:
  explicit ChainedScheduler(std::vector<std::unique_ptr<LRScheduler>> schedulers);
  std::vector<double> factors_at(int64_t epoch) const override;
  size_t size() const { return schedulers_.size(); }
  const LRScheduler& scheduler(size_t i) const { return *schedulers_.at(i); }

 protected:
  void apply(int64_t epoch) override;
  void save_extra(StateDict& dict) const override;
  void restore(const StateDict& dict, int64_t epoch) override;
  void rebase(const std::vector<double>& lrs) override;

 private:
  // Sets the children's last_epoch and last_lr (their own lrs) to step `epoch`.
  void follow(int64_t epoch);

  std::vector<std::unique_ptr<FactorScheduler>> schedulers_;
};

// Linear warmup composed with another schedule: for the first warmup_steps steps the lr
// rises linearly from start_factor times the base lr to it, then `after` runs from its own
// step 0. Exactly SequentialLR([LinearLR(start_factor, 1, warmup_steps), after],
// [warmup_steps]), as PyTorch computes it (after a OneCycleLR the warmup reaches its
// initial lr; its momentum stays at its step 0 meanwhile).
class LinearWarmup : public SequentialLR {
 public:
  // Drives `after`'s optimizer; `after` (not yet stepped) belongs to the warmup from now on.
  LinearWarmup(std::unique_ptr<LRScheduler> after, int64_t warmup_steps,
               double start_factor = 1.0 / 3.0);
  // Warmup to the optimizer's lrs, which then stay constant.
  LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor = 1.0 / 3.0);
};

struct PlateauOptions {
  enum class Mode { kMin, kMax };
  enum class ThresholdMode { kRel, kAbs };
  Mode mode = Mode::kMin;   // kMin: lower metrics are better (a loss); kMax: an accuracy
  double factor = 0.1;      // new lr = lr * factor, in [0, 1)
  int64_t patience = 10;    // bad steps tolerated before reducing
  double threshold = 1e-4;  // how much better counts as better
  ThresholdMode threshold_mode = ThresholdMode::kRel;
  int64_t cooldown = 0;                // steps after a reduction during which bad steps don't count
  std::vector<double> min_lr = {0.0};  // one for all groups, or one per group
  double eps = 1e-8;                   // reductions smaller than this are skipped
};

// Reduces the lr by `factor` once the metric has not improved for more than `patience`
// steps (torch.optim.lr_scheduler.ReduceLROnPlateau, its defaults included). "Better" is
// metric < best * (1 - threshold) (kMin, kRel), < best - threshold (kMin, kAbs),
// > best * (1 + threshold) (kMax, kRel) or > best + threshold (kMax, kAbs); a NaN metric is
// never better. It reads and writes the groups' current lrs, so it composes with nothing.
class ReduceLROnPlateau : public LRScheduler {
 public:
  explicit ReduceLROnPlateau(Optimizer& optimizer, PlateauOptions options = {});
  // One step with the watched metric (a validation loss, an accuracy).
  void step(double metric);
  // Throws: the schedule needs the metric.
  void step() override;
  // Throws: the lr follows the metrics, not the step count.
  std::vector<double> lr_at(int64_t epoch) const override;

  double best() const { return best_; }
  int64_t num_bad_epochs() const { return num_bad_epochs_; }
  int64_t cooldown_counter() const { return cooldown_counter_; }
  bool in_cooldown() const { return cooldown_counter_ > 0; }

 protected:
  // Adds "best", "num_bad_epochs" and "cooldown_counter"; loading writes last_lr back.
  void save_extra(StateDict& dict) const override;
  void restore(const StateDict& dict, int64_t epoch) override;

 private:
  bool is_better(double metric) const;

  PlateauOptions options_;
  std::vector<double> min_lrs_;
  double best_;
  int64_t num_bad_epochs_ = 0;
  int64_t cooldown_counter_ = 0;
};

// Linear warmup then cosine decay, by steps: nanoGPT's get_lr as first published (later
// versions warm up as (step + 1) / (warmup_steps + 1)).
//   step < warmup_steps:               lr = base_lr * step / warmup_steps  (0 at step 0)
//   warmup_steps <= step <= max_steps: lr = min_lr + (base_lr - min_lr) * (1 + cos(pi * r)) / 2,
//                                      r = (step - warmup_steps) / (max_steps - warmup_steps)
//   step > max_steps:                  lr = min_lr
// min_lr is one absolute lr for every group (nanoGPT: about base_lr / 10), at most each base
// lr. LinearWarmup + CosineAnnealingLR differ from this (their warmup cannot start at 0 and
// the cosine rises again past its t_max), hence a schedule of its own.
class CosineWithWarmupLR : public LRScheduler {
 public:
  CosineWithWarmupLR(Optimizer& optimizer, int64_t warmup_steps, int64_t max_steps,
                     double min_lr = 0.0);
  std::vector<double> lr_at(int64_t epoch) const override;

 private:
  int64_t warmup_steps_;
  int64_t max_steps_;
  double min_lr_;
};

}  // namespace ember::optim

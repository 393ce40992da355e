#include "lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace ember::optim {

// --- LRScheduler ---------------------------------------------------------------------------

LRScheduler::LRScheduler(const char* name, Optimizer& optimizer)
    : name_(name), optimizer_(optimizer) {
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.lr());
}

void LRScheduler::start() {
  last_epoch_ = 0;
  apply(0);
  last_lr_.clear();
  for (const auto& group : optimizer_.param_groups()) last_lr_.push_back(group.lr());
}

void LRScheduler::step() {
  apply(last_epoch_ + 1);  // throws before anything changes when the step is invalid
  ++last_epoch_;
  last_lr_.clear();
  for (const auto& group : optimizer_.param_groups()) last_lr_.push_back(group.lr());
}

void LRScheduler::apply(int64_t epoch) { set_lrs(lr_at(epoch)); }

void LRScheduler::set_lrs(const std::vector<double>& lrs) {
  auto& groups = optimizer_.param_groups();
  EMBER_CHECK(groups.size() == lrs.size(), name_, "the optimizer has ", groups.size(),
              " param groups but the schedule was built for ", lrs.size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_lr(lrs[g]);
}

StateDict LRScheduler::state_dict() const {
  StateDict dict;
  dict.scalars["last_epoch"] = static_cast<double>(last_epoch_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    dict.scalars["base_lrs." + std::to_string(g)] = base_lrs_[g];
    dict.scalars["last_lr." + std::to_string(g)] = last_lr_[g];
  }
  return dict;
}

void LRScheduler::load_state_dict(const StateDict& dict) {
  const auto it = dict.scalars.find("last_epoch");
  EMBER_CHECK(it != dict.scalars.end() && it->second >= 0 && it->second == std::floor(it->second),
              name_, "load_state_dict: missing or invalid \"last_epoch\"");
  const size_t expected = base_lrs_.size() * 2 + 1;
  EMBER_CHECK(dict.scalars.size() == expected && dict.tensors.empty(), name_,
              "load_state_dict: expected ", expected, " scalars for ", base_lrs_.size(),
              " param groups but got ", dict.scalars.size(), " scalars and ", dict.tensors.size(),
              " tensors");
  std::vector<double> base_lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    const auto base = dict.scalars.find("base_lrs." + std::to_string(g));
    EMBER_CHECK(base != dict.scalars.end() && dict.scalars.count("last_lr." + std::to_string(g)),
                name_, "load_state_dict: no learning rates for param group ", g);
    base_lrs.push_back(base->second);
  }
  const std::vector<double> saved_base = base_lrs_;
  base_lrs_ = base_lrs;
  const auto epoch = static_cast<int64_t>(it->second);
  try {
    apply(epoch);
  } catch (...) {
    base_lrs_ = saved_base;
    throw;
  }
  last_epoch_ = epoch;
  last_lr_.clear();
  for (const auto& group : optimizer_.param_groups()) last_lr_.push_back(group.lr());
}

// --- StepLR, MultiStepLR, CosineAnnealingLR ---------------------------------------------------

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  EMBER_CHECK(step_size > 0, "StepLR", "step_size must be > 0, got ", step_size);
  EMBER_CHECK(gamma > 0, "StepLR", "gamma must be > 0, got ", gamma);
  start();
}

std::vector<double> StepLR::lr_at(int64_t epoch) const {
  const double factor = std::pow(gamma_, static_cast<double>(epoch / step_size_));
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * factor);
  return lrs;
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : LRScheduler("MultiStepLR", optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  EMBER_CHECK(gamma > 0, "MultiStepLR", "gamma must be > 0, got ", gamma);
  std::sort(milestones_.begin(), milestones_.end());
  start();
}

std::vector<double> MultiStepLR::lr_at(int64_t epoch) const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  const double factor = std::pow(gamma_, static_cast<double>(passed));
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(base * factor);
  return lrs;
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler("CosineAnnealingLR", optimizer), t_max_(t_max), eta_min_(eta_min) {
  EMBER_CHECK(t_max > 0, "CosineAnnealingLR", "T_max must be > 0, got ", t_max);
  EMBER_CHECK(eta_min >= 0, "CosineAnnealingLR", "eta_min must be >= 0, got ", eta_min);
  start();
}

std::vector<double> CosineAnnealingLR::lr_at(int64_t epoch) const {
  const double cosine =
      std::cos(std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max_));
  std::vector<double> lrs;
  for (double base : base_lrs_) lrs.push_back(eta_min_ + (base - eta_min_) * (1 + cosine) / 2);
  return lrs;
}

// --- OneCycleLR ----------------------------------------------------------------------------

OneCycleLR::OneCycleLR(Optimizer& optimizer, double max_lr, int64_t total_steps,
                       OneCycleOptions options)
    : OneCycleLR(optimizer, std::vector<double>(optimizer.param_groups().size(), max_lr),
                 total_steps, options) {}

OneCycleLR::OneCycleLR(Optimizer& optimizer, std::vector<double> max_lrs, int64_t total_steps,
                       OneCycleOptions options)
    : LRScheduler("OneCycleLR", optimizer),
      max_lrs_(std::move(max_lrs)),
      total_steps_(total_steps),
      options_(options) {
  const size_t groups = optimizer.param_groups().size();
  EMBER_CHECK(max_lrs_.size() == groups, "OneCycleLR", "expected ", groups,
              " values for max_lr, got ", max_lrs_.size());
  EMBER_CHECK(total_steps > 0, "OneCycleLR", "total_steps must be > 0, got ", total_steps);
  EMBER_CHECK(options.pct_start >= 0 && options.pct_start <= 1, "OneCycleLR",
              "pct_start must be in [0, 1], got ", options.pct_start);
  EMBER_CHECK(options.div_factor > 0 && options.final_div_factor > 0, "OneCycleLR",
              "div_factor and final_div_factor must be > 0, got ", options.div_factor, " and ",
              options.final_div_factor);
  for (size_t g = 0; g < groups; ++g) {
    EMBER_CHECK(max_lrs_[g] >= 0, "OneCycleLR", "max_lr must be >= 0, got ", max_lrs_[g]);
    base_lrs_[g] = max_lrs_[g] / options.div_factor;
    min_lrs_.push_back(base_lrs_[g] / options.final_div_factor);
  }
  if (options.cycle_momentum) {
    const Options& defaults = optimizer.defaults();
    momentum_key_ = defaults.count("momentum") ? "momentum"
                    : defaults.count("beta1")  ? "beta1"
                                               : "";
    EMBER_CHECK(!momentum_key_.empty(), "OneCycleLR", optimizer.name(),
                " has neither momentum nor beta1 to cycle; pass cycle_momentum = false");
  }

  const double total = static_cast<double>(total_steps);
  const double max_m = options.max_momentum;
  const double base_m = options.base_momentum;
  if (options.three_phase) {
    phases_ = {{options.pct_start * total - 1, kInitialLr, kMaxLr, max_m, base_m},
               {2 * options.pct_start * total - 2, kMaxLr, kInitialLr, base_m, max_m},
               {total - 1, kInitialLr, kMinLr, max_m, max_m}};
  } else {
    phases_ = {{options.pct_start * total - 1, kInitialLr, kMaxLr, max_m, base_m},
               {total - 1, kMaxLr, kMinLr, base_m, max_m}};
  }
  start();
}

double OneCycleLR::anneal(double start, double end, double pct) const {
  if (options_.anneal_strategy == OneCycleOptions::Anneal::kLinear)
    return (end - start) * pct + start;
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1);
}

std::pair<const OneCycleLR::Phase*, double> OneCycleLR::locate(int64_t epoch) const {
  EMBER_CHECK(epoch <= total_steps_, "OneCycleLR", "tried to step ", epoch,
              " times; total_steps is ", total_steps_);
  const auto step = static_cast<double>(epoch);
  double start_step = 0;
  for (size_t i = 0; i < phases_.size(); ++i) {
    const Phase& phase = phases_[i];
    if (step <= phase.end_step || i + 1 == phases_.size())
      return {&phase, (step - start_step) / (phase.end_step - start_step)};
    start_step = phase.end_step;
  }
  EMBER_ASSERT(false, "OneCycleLR has no phases");
  return {nullptr, 0.0};
}

std::vector<double> OneCycleLR::lr_at(int64_t epoch) const {
  const auto [phase, pct] = locate(epoch);
  const auto point = [&](LrPoint p, size_t g) {
    return p == kInitialLr ? base_lrs_[g] : p == kMaxLr ? max_lrs_[g] : min_lrs_[g];
  };
  std::vector<double> lrs;
  for (size_t g = 0; g < max_lrs_.size(); ++g)
    lrs.push_back(anneal(point(phase->start_lr, g), point(phase->end_lr, g), pct));
  return lrs;
}

double OneCycleLR::momentum_at(int64_t epoch) const {
  const auto [phase, pct] = locate(epoch);
  return anneal(phase->start_momentum, phase->end_momentum, pct);
}

void OneCycleLR::apply(int64_t epoch) {
  const std::vector<double> lrs = lr_at(epoch);
  set_lrs(lrs);
  if (momentum_key_.empty()) return;
  const double momentum = momentum_at(epoch);
  for (auto& group : optimizer().param_groups()) group.options[momentum_key_] = momentum;
}

// --- LinearWarmup --------------------------------------------------------------------------

namespace {
Optimizer& optimizer_of(const std::unique_ptr<LRScheduler>& after) {
  EMBER_CHECK(after != nullptr, "LinearWarmup", "the schedule to warm up into is null");
  return after->optimizer();
}
}  // namespace

LinearWarmup::LinearWarmup(std::unique_ptr<LRScheduler> after, int64_t warmup_steps,
                           double start_factor)
    : LRScheduler("LinearWarmup", optimizer_of(after)),
      after_(std::move(after)),
      warmup_steps_(warmup_steps),
      start_factor_(start_factor) {
  EMBER_CHECK(warmup_steps > 0, "LinearWarmup", "warmup_steps must be > 0, got ", warmup_steps);
  EMBER_CHECK(start_factor > 0 && start_factor <= 1, "LinearWarmup",
              "start_factor must be in (0, 1], got ", start_factor);
  EMBER_CHECK(after_->last_epoch() == 0, "LinearWarmup",
              "the wrapped schedule has already stepped ", after_->last_epoch(), " times");
  start();
}

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor)
    : LRScheduler("LinearWarmup", optimizer),
      warmup_steps_(warmup_steps),
      start_factor_(start_factor) {
  EMBER_CHECK(warmup_steps > 0, "LinearWarmup", "warmup_steps must be > 0, got ", warmup_steps);
  EMBER_CHECK(start_factor > 0 && start_factor <= 1, "LinearWarmup",
              "start_factor must be in (0, 1], got ", start_factor);
  start();
}

std::vector<double> LinearWarmup::lr_at(int64_t epoch) const {
  if (epoch >= warmup_steps_) return after_ ? after_->lr_at(epoch - warmup_steps_) : base_lrs_;
  const double factor = start_factor_ + (1.0 - start_factor_) * static_cast<double>(epoch) /
                                            static_cast<double>(warmup_steps_);
  std::vector<double> lrs = after_ ? after_->lr_at(0) : base_lrs_;
  for (double& lr : lrs) lr *= factor;
  return lrs;
}

void LinearWarmup::apply(int64_t epoch) {
  if (epoch >= warmup_steps_ && after_) {
    after_->apply(epoch - warmup_steps_);
    return;
  }
  set_lrs(lr_at(epoch));
}

}  // namespace ember::optim

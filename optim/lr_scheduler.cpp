#include "lr_scheduler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>
#include <string>

namespace ember::optim {

namespace {

std::atomic<uint64_t> next_order{0};

std::string group_key(const char* what, size_t g) { return what + ("." + std::to_string(g)); }

// The scheduler type a dict names at `prefix` ("" or "schedulers.<i>."), or "".
std::string type_at(const StateDict& dict, const std::string& prefix) {
  const std::string type_prefix = prefix + "type.";
  for (const auto& [key, value] : dict.scalars) {
    if (key.rfind(type_prefix, 0) != 0) continue;
    const std::string rest = key.substr(type_prefix.size());
    if (rest.find('.') == std::string::npos) return rest;
  }
  return "";
}

// One lambda per group from one for all or one per group; `who` names the schedule.
std::vector<LrLambda> per_group(const char* who, std::vector<LrLambda> lambdas, size_t groups) {
  if (lambdas.size() == 1 && groups != 1) lambdas.resize(groups, lambdas[0]);
  EMBER_CHECK(lambdas.size() == groups, who, "expected ", groups, " lr_lambdas, got ",
              lambdas.size());
  for (size_t g = 0; g < groups; ++g)
    EMBER_CHECK(static_cast<bool>(lambdas[g]), who, "lr_lambda of group ", g, " is empty");
  return lambdas;
}

}  // namespace

// --- LRScheduler ---------------------------------------------------------------------------

LRScheduler::LRScheduler(const char* name, Optimizer& optimizer)
    : name_(name), optimizer_(optimizer), order_(next_order++) {
  for (const auto& group : optimizer.param_groups()) base_lrs_.push_back(group.lr());
  found_lrs_ = base_lrs_;
}

void LRScheduler::start() {
  apply(0);
  record(0);
}

void LRScheduler::record(int64_t epoch) {
  last_epoch_ = epoch;
  last_lr_.clear();
  for (const auto& group : optimizer_.param_groups()) last_lr_.push_back(group.lr());
}

void LRScheduler::step() {
  apply(last_epoch_ + 1);  // throws before anything changes when the step is invalid
  record(last_epoch_ + 1);
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
  dict.scalars[std::string("type.") + name_] = 1.0;
  dict.scalars["last_epoch"] = static_cast<double>(last_epoch_);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    dict.scalars[group_key("base_lrs", g)] = base_lrs_[g];
    dict.scalars[group_key("last_lr", g)] = last_lr_[g];
  }
  save_extra(dict);
  return dict;
}

void LRScheduler::load_state_dict(const StateDict& dict) {
  const StateDict expected = state_dict();
  // The state of another schedule (this one's or a child's, by the prefix of its keys) is
  // named as such.
  for (const auto& [key, value] : expected.scalars) {
    const size_t at = key.rfind("type.", 0) == 0 ? 0 : key.find(".type.");
    if (at == std::string::npos) continue;
    const std::string prefix = at == 0 ? "" : key.substr(0, at + 1);
    const std::string want = key.substr(prefix.size() + 5);
    const std::string got = type_at(dict, prefix);
    EMBER_CHECK(!got.empty() || !prefix.empty(), name_,
                "load_state_dict: the state names no scheduler (no \"type.", want,
                "\" key); expected the state of ", want);
    EMBER_CHECK(got.empty() || got == want, name_, "load_state_dict: ",
                prefix.empty() ? "the state" : "the state at \"" + prefix + "\"", " is from ", got,
                ", not ", want);
  }
  const auto it = dict.scalars.find("last_epoch");
  EMBER_CHECK(it != dict.scalars.end() && it->second >= 0 && it->second == std::floor(it->second),
              name_, "load_state_dict: missing or invalid \"last_epoch\"");
  const auto count_groups = [](const StateDict& d) {
    size_t n = 0;
    while (d.scalars.count(group_key("base_lrs", n))) ++n;
    return n;
  };
  EMBER_CHECK(count_groups(dict) == base_lrs_.size(), name_, "load_state_dict: the state is for ",
              count_groups(dict), " param groups, the optimizer has ", base_lrs_.size());
  EMBER_CHECK(dict.tensors.empty(), name_, "load_state_dict: expected no tensors, got ",
              dict.tensors.size());
  for (const auto& [key, value] : expected.scalars)
    EMBER_CHECK(dict.scalars.count(key), name_, "load_state_dict: missing \"", key, "\"");
  for (const auto& [key, value] : dict.scalars)
    EMBER_CHECK(expected.scalars.count(key), name_, "load_state_dict: unexpected \"", key,
                "\" (is the schedule configured as the one saved?)");

  const auto load = [this](const StateDict& from) {
    for (size_t g = 0; g < base_lrs_.size(); ++g)
      base_lrs_[g] = from.scalars.at(group_key("base_lrs", g));
    const auto epoch = static_cast<int64_t>(from.scalars.at("last_epoch"));
    restore(from, epoch);
    record(epoch);
  };
  try {
    load(dict);
  } catch (...) {
    load(expected);  // back to where it was
    throw;
  }
}

void LRScheduler::check_children(const char* composite,
                                 const std::vector<std::unique_ptr<LRScheduler>>& children,
                                 const Optimizer& optimizer) {
  EMBER_CHECK(!children.empty(), composite, "needs at least one schedule");
  for (size_t i = 0; i < children.size(); ++i) {
    EMBER_CHECK(children[i] != nullptr, composite, "schedule ", i, " is null");
    const LRScheduler& child = *children[i];
    EMBER_CHECK(&child.optimizer() == &optimizer, composite, "schedule ", i, " (", child.name(),
                ") is on a different optimizer (", child.optimizer().name(),
                ") than schedule 0 or the one given");
    EMBER_CHECK(child.last_epoch() == 0, composite, "schedule ", i, " (", child.name(),
                ") has already stepped ", child.last_epoch(), " times");
  }
}

std::vector<double> LRScheduler::adopt_initial_lrs(const std::vector<LRScheduler*>& children) {
  std::vector<LRScheduler*> built = children;
  std::sort(built.begin(), built.end(),
            [](const LRScheduler* a, const LRScheduler* b) { return a->order_ < b->order_; });
  std::vector<double> initial = built.front()->found_lrs_;
  for (LRScheduler* child : built) {
    if (child->sets_initial_lr()) {
      initial = child->base_lrs_;
    } else {
      child->rebase(initial);
    }
  }
  return initial;
}

// --- Factor schedules ------------------------------------------------------------------------

std::vector<double> FactorScheduler::lr_at(int64_t epoch) const {
  std::vector<double> lrs = factors_at(epoch);
  for (size_t g = 0; g < lrs.size(); ++g) lrs[g] *= base_lrs_[g];
  return lrs;
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : FactorScheduler("StepLR", optimizer), step_size_(step_size), gamma_(gamma) {
  EMBER_CHECK(step_size > 0, "StepLR", "step_size must be > 0, got ", step_size);
  EMBER_CHECK(gamma > 0, "StepLR", "gamma must be > 0, got ", gamma);
  start();
}

std::vector<double> StepLR::factors_at(int64_t epoch) const {
  return std::vector<double>(base_lrs_.size(),
                             std::pow(gamma_, static_cast<double>(epoch / step_size_)));
}

MultiStepLR::MultiStepLR(Optimizer& optimizer, std::vector<int64_t> milestones, double gamma)
    : FactorScheduler("MultiStepLR", optimizer), milestones_(std::move(milestones)), gamma_(gamma) {
  EMBER_CHECK(gamma > 0, "MultiStepLR", "gamma must be > 0, got ", gamma);
  std::sort(milestones_.begin(), milestones_.end());
  start();
}

std::vector<double> MultiStepLR::factors_at(int64_t epoch) const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin();
  return std::vector<double>(base_lrs_.size(), std::pow(gamma_, static_cast<double>(passed)));
}

ExponentialLR::ExponentialLR(Optimizer& optimizer, double gamma)
    : FactorScheduler("ExponentialLR", optimizer), gamma_(gamma) {
  EMBER_CHECK(gamma > 0, "ExponentialLR", "gamma must be > 0, got ", gamma);
  start();
}

std::vector<double> ExponentialLR::factors_at(int64_t epoch) const {
  return std::vector<double>(base_lrs_.size(), std::pow(gamma_, static_cast<double>(epoch)));
}

ConstantLR::ConstantLR(Optimizer& optimizer, double factor, int64_t total_iters)
    : FactorScheduler("ConstantLR", optimizer), factor_(factor), total_iters_(total_iters) {
  EMBER_CHECK(factor >= 0 && factor <= 1, "ConstantLR", "factor must be in [0, 1], got ", factor);
  EMBER_CHECK(total_iters > 0, "ConstantLR", "total_iters must be > 0, got ", total_iters);
  start();
}

std::vector<double> ConstantLR::factors_at(int64_t epoch) const {
  return std::vector<double>(base_lrs_.size(), epoch >= total_iters_ ? 1.0 : factor_);
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor,
                   int64_t total_iters)
    : FactorScheduler("LinearLR", optimizer),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  EMBER_CHECK(start_factor > 0 && start_factor <= 1, "LinearLR",
              "start_factor must be in (0, 1], got ", start_factor);
  EMBER_CHECK(end_factor >= 0 && end_factor <= 1, "LinearLR", "end_factor must be in [0, 1], got ",
              end_factor);
  EMBER_CHECK(total_iters > 0, "LinearLR", "total_iters must be > 0, got ", total_iters);
  start();
}

std::vector<double> LinearLR::factors_at(int64_t epoch) const {
  const double done = static_cast<double>(std::min(epoch, total_iters_));
  return std::vector<double>(
      base_lrs_.size(),
      start_factor_ + (end_factor_ - start_factor_) * done / static_cast<double>(total_iters_));
}

PolynomialLR::PolynomialLR(Optimizer& optimizer, int64_t total_iters, double power)
    : FactorScheduler("PolynomialLR", optimizer), total_iters_(total_iters), power_(power) {
  EMBER_CHECK(total_iters > 0, "PolynomialLR", "total_iters must be > 0, got ", total_iters);
  EMBER_CHECK(power >= 0, "PolynomialLR", "power must be >= 0, got ", power);
  start();
}

std::vector<double> PolynomialLR::factors_at(int64_t epoch) const {
  const double done = static_cast<double>(std::min(epoch, total_iters_));
  return std::vector<double>(base_lrs_.size(),
                             std::pow(1.0 - done / static_cast<double>(total_iters_), power_));
}

MultiplicativeLR::MultiplicativeLR(Optimizer& optimizer, LrLambda lr_lambda)
    : MultiplicativeLR(optimizer, std::vector<LrLambda>{std::move(lr_lambda)}) {}

MultiplicativeLR::MultiplicativeLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas)
    : FactorScheduler("MultiplicativeLR", optimizer),
      lambdas_(
          per_group("MultiplicativeLR", std::move(lr_lambdas), optimizer.param_groups().size())),
      cached_(lambdas_.size(), 1.0) {
  start();
}

std::vector<double> MultiplicativeLR::factors_at(int64_t epoch) const {
  if (epoch < cached_epoch_) {
    cached_epoch_ = 0;
    std::fill(cached_.begin(), cached_.end(), 1.0);
  }
  for (; cached_epoch_ < epoch; ++cached_epoch_) {
    for (size_t g = 0; g < cached_.size(); ++g) cached_[g] *= lambdas_[g](cached_epoch_ + 1);
  }
  return cached_;
}

// --- LambdaLR, CosineAnnealingLR -------------------------------------------------------------

LambdaLR::LambdaLR(Optimizer& optimizer, LrLambda lr_lambda)
    : LambdaLR(optimizer, std::vector<LrLambda>{std::move(lr_lambda)}) {}

LambdaLR::LambdaLR(Optimizer& optimizer, std::vector<LrLambda> lr_lambdas)
    : LRScheduler("LambdaLR", optimizer),
      lambdas_(per_group("LambdaLR", std::move(lr_lambdas), optimizer.param_groups().size())) {
  start();
}

std::vector<double> LambdaLR::lr_at(int64_t epoch) const {
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g) lrs.push_back(base_lrs_[g] * lambdas_[g](epoch));
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

// --- SequentialLR, ChainedScheduler ------------------------------------------------------------

namespace {

Optimizer& first_optimizer(const char* who,
                           const std::vector<std::unique_ptr<LRScheduler>>& schedulers) {
  EMBER_CHECK(!schedulers.empty(), who, "needs at least one schedule");
  EMBER_CHECK(schedulers[0] != nullptr, who, "schedule 0 is null");
  return schedulers[0]->optimizer();
}

std::string child_prefix(size_t i) { return "schedulers." + std::to_string(i) + "."; }

template <typename Child>
void save_children(StateDict& dict, const std::vector<std::unique_ptr<Child>>& children) {
  for (size_t i = 0; i < children.size(); ++i) {
    for (const auto& [key, value] : children[i]->state_dict().scalars)
      dict.scalars[child_prefix(i) + key] = value;
  }
}

template <typename Child>
void load_children(const StateDict& dict, const std::vector<std::unique_ptr<Child>>& children) {
  for (size_t i = 0; i < children.size(); ++i) {
    const std::string prefix = child_prefix(i);
    StateDict child;
    for (const auto& [key, value] : dict.scalars)
      if (key.rfind(prefix, 0) == 0) child.scalars[key.substr(prefix.size())] = value;
    children[i]->load_state_dict(child);
  }
}

template <typename Child>
std::vector<LRScheduler*> raw(const std::vector<std::unique_ptr<Child>>& children) {
  std::vector<LRScheduler*> out;
  for (const auto& child : children) out.push_back(child.get());
  return out;
}

}  // namespace

SequentialLR::SequentialLR(Optimizer& optimizer,
                           std::vector<std::unique_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler("SequentialLR", optimizer),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  init();
}

SequentialLR::SequentialLR(const char* name, std::vector<std::unique_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(name, first_optimizer(name, schedulers)),
      schedulers_(std::move(schedulers)),
      milestones_(std::move(milestones)) {
  init();
}

void SequentialLR::init() {
  check_children(name(), schedulers_, optimizer());
  EMBER_CHECK(milestones_.size() + 1 == schedulers_.size(), name(), "expected ",
              schedulers_.size() - 1, " milestones for ", schedulers_.size(), " schedules, got ",
              milestones_.size());
  for (size_t i = 0; i < milestones_.size(); ++i) {
    const int64_t previous = i == 0 ? 0 : milestones_[i - 1];
    EMBER_CHECK(milestones_[i] > previous, name(), "milestones must be > 0 and increasing, got ",
                milestones_[i], i == 0 ? " first" : " after " + std::to_string(previous));
  }
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    LRScheduler* child = schedulers_[i].get();
    EMBER_CHECK(dynamic_cast<ReduceLROnPlateau*>(child) == nullptr, name(), "schedule ", i,
                " is a ReduceLROnPlateau, which steps on a metric");
    EMBER_CHECK(dynamic_cast<SequentialLR*>(child) == nullptr &&
                    dynamic_cast<ChainedScheduler*>(child) == nullptr,
                name(), "schedule ", i, " (", child->name(),
                ") is itself a composite, which PyTorch cannot restart at a milestone");
    EMBER_CHECK(i == 0 || dynamic_cast<MultiplicativeLR*>(child) == nullptr, name(), "schedule ", i,
                " is a MultiplicativeLR, which may only come first (PyTorch's continues ",
                "from the previous schedule's lr)");
  }
  const std::vector<LRScheduler*> children = raw(schedulers_);
  order_ = (*std::min_element(children.begin(), children.end(), [](auto* a, auto* b) {
             return a->order_ < b->order_;
           }))->order_;
  const std::vector<double> initial = adopt_initial_lrs(children);
  // PyTorch resets the lrs to the last initial_lr and steps schedule 0 from there: the
  // schedules that chain on the group's lr start from it, the others keep their own base.
  LRScheduler& first = *schedulers_[0];
  if (!first.sets_initial_lr() && (dynamic_cast<FactorScheduler*>(&first) != nullptr ||
                                   dynamic_cast<CosineAnnealingLR*>(&first) != nullptr)) {
    first.rebase(initial);
  }
  base_lrs_ = initial;
  // Each child's last_lr is its own step-0 lr until it runs.
  for (LRScheduler* child : children) child->last_lr_ = child->lr_at(0);
  start();
}

std::pair<size_t, int64_t> SequentialLR::locate(int64_t epoch) const {
  const auto i = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  return {i, i == 0 ? epoch : epoch - milestones_[i - 1]};
}

std::vector<double> SequentialLR::lr_at(int64_t epoch) const {
  const auto [i, local] = locate(epoch);
  return schedulers_[i]->lr_at(local);
}

void SequentialLR::apply(int64_t epoch) {
  const auto [i, local] = locate(epoch);
  schedulers_[i]->apply(local);
  schedulers_[i]->record(local);
}

void SequentialLR::save_extra(StateDict& dict) const { save_children(dict, schedulers_); }

void SequentialLR::restore(const StateDict& dict, int64_t epoch) {
  load_children(dict, schedulers_);
  apply(epoch);
}

ChainedScheduler::ChainedScheduler(std::vector<std::unique_ptr<LRScheduler>> schedulers)
    : FactorScheduler("ChainedScheduler", first_optimizer("ChainedScheduler", schedulers)) {
  check_children(name(), schedulers, optimizer());
  for (size_t i = 0; i < schedulers.size(); ++i) {
    EMBER_CHECK(dynamic_cast<FactorScheduler*>(schedulers[i].get()) != nullptr, name(), "schedule ",
                i, " (", schedulers[i]->name(),
                ") is not of the form lr = base_lr * factor(step), and PyTorch chains it by "
                "overwriting or by a recurrence; chain StepLR, MultiStepLR, ExponentialLR, "
                "ConstantLR, LinearLR, PolynomialLR, MultiplicativeLR or ChainedScheduler, or "
                "run schedules one after another with SequentialLR");
  }
  for (auto& child : schedulers)
    schedulers_.emplace_back(static_cast<FactorScheduler*>(child.release()));
  const std::vector<LRScheduler*> children = raw(schedulers_);
  const LRScheduler* first = *std::min_element(
      children.begin(), children.end(), [](auto* a, auto* b) { return a->order_ < b->order_; });
  order_ = first->order_;
  found_lrs_ = first->found_lrs_;
  base_lrs_ = adopt_initial_lrs(children);
  start();
}

std::vector<double> ChainedScheduler::factors_at(int64_t epoch) const {
  std::vector<double> factors(base_lrs_.size(), 1.0);
  for (const auto& child : schedulers_) {
    const std::vector<double> f = child->factors_at(epoch);
    for (size_t g = 0; g < factors.size(); ++g) factors[g] *= f[g];
  }
  return factors;
}

void ChainedScheduler::apply(int64_t epoch) {
  set_lrs(lr_at(epoch));
  follow(epoch);
}

void ChainedScheduler::follow(int64_t epoch) {
  for (const auto& child : schedulers_) {
    child->last_epoch_ = epoch;
    child->last_lr_ = child->lr_at(epoch);
    if (auto* chain = dynamic_cast<ChainedScheduler*>(child.get())) chain->follow(epoch);
  }
}

void ChainedScheduler::rebase(const std::vector<double>& lrs) {
  base_lrs_ = lrs;
  for (const auto& child : schedulers_) child->rebase(lrs);
}

void ChainedScheduler::save_extra(StateDict& dict) const { save_children(dict, schedulers_); }

void ChainedScheduler::restore(const StateDict& dict, int64_t epoch) {
  load_children(dict, schedulers_);
  apply(epoch);
}

// --- LinearWarmup --------------------------------------------------------------------------

namespace {

void check_warmup(int64_t warmup_steps, double start_factor) {
  EMBER_CHECK(warmup_steps > 0, "LinearWarmup", "warmup_steps must be > 0, got ", warmup_steps);
  EMBER_CHECK(start_factor > 0 && start_factor <= 1, "LinearWarmup",
              "start_factor must be in (0, 1], got ", start_factor);
}

std::vector<std::unique_ptr<LRScheduler>> warmup_then(std::unique_ptr<LRScheduler>&& after,
                                                      int64_t warmup_steps, double start_factor) {
  EMBER_CHECK(after != nullptr, "LinearWarmup", "the schedule to warm up into is null");
  check_warmup(warmup_steps, start_factor);
  EMBER_CHECK(after->last_epoch() == 0, "LinearWarmup", "the wrapped schedule has already stepped ",
              after->last_epoch(), " times");
  std::vector<std::unique_ptr<LRScheduler>> out;
  out.push_back(std::make_unique<LinearLR>(after->optimizer(), start_factor, 1.0, warmup_steps));
  out.push_back(std::move(after));
  return out;
}

std::vector<std::unique_ptr<LRScheduler>> warmup_only(Optimizer& optimizer, int64_t warmup_steps,
                                                      double start_factor) {
  check_warmup(warmup_steps, start_factor);
  std::vector<std::unique_ptr<LRScheduler>> out;
  out.push_back(std::make_unique<LinearLR>(optimizer, start_factor, 1.0, warmup_steps));
  return out;
}

}  // namespace

LinearWarmup::LinearWarmup(std::unique_ptr<LRScheduler> after, int64_t warmup_steps,
                           double start_factor)
    : SequentialLR("LinearWarmup", warmup_then(std::move(after), warmup_steps, start_factor),
                   {warmup_steps}) {}

LinearWarmup::LinearWarmup(Optimizer& optimizer, int64_t warmup_steps, double start_factor)
    : SequentialLR("LinearWarmup", warmup_only(optimizer, warmup_steps, start_factor), {}) {}

// --- ReduceLROnPlateau -----------------------------------------------------------------------

ReduceLROnPlateau::ReduceLROnPlateau(Optimizer& optimizer, PlateauOptions options)
    : LRScheduler("ReduceLROnPlateau", optimizer), options_(std::move(options)) {
  const PlateauOptions& o = options_;
  EMBER_CHECK(o.factor >= 0 && o.factor < 1, name(), "factor must be in [0, 1), got ", o.factor);
  EMBER_CHECK(o.patience >= 0, name(), "patience must be >= 0, got ", o.patience);
  EMBER_CHECK(o.cooldown >= 0, name(), "cooldown must be >= 0, got ", o.cooldown);
  EMBER_CHECK(o.threshold >= 0, name(), "threshold must be >= 0, got ", o.threshold);
  EMBER_CHECK(o.eps >= 0, name(), "eps must be >= 0, got ", o.eps);
  const size_t groups = optimizer.param_groups().size();
  EMBER_CHECK(o.min_lr.size() == 1 || o.min_lr.size() == groups, name(), "expected 1 or ", groups,
              " min_lr values, got ", o.min_lr.size());
  min_lrs_ = o.min_lr.size() == 1 ? std::vector<double>(groups, o.min_lr[0]) : o.min_lr;
  for (double min_lr : min_lrs_)
    EMBER_CHECK(min_lr >= 0, name(), "min_lr must be >= 0, got ", min_lr);
  best_ = o.mode == PlateauOptions::Mode::kMin ? std::numeric_limits<double>::infinity()
                                               : -std::numeric_limits<double>::infinity();
  record(0);
}

void ReduceLROnPlateau::step() {
  EMBER_CHECK(false, name(), "step() needs the watched metric: call step(metric)");
}

std::vector<double> ReduceLROnPlateau::lr_at(int64_t epoch) const {
  EMBER_CHECK(false, name(), "the lr follows the metrics, not the step count: no lr_at(", epoch,
              ")");
  return {};
}

bool ReduceLROnPlateau::is_better(double metric) const {
  const bool rel = options_.threshold_mode == PlateauOptions::ThresholdMode::kRel;
  if (options_.mode == PlateauOptions::Mode::kMin)
    return rel ? metric < best_ * (1.0 - options_.threshold) : metric < best_ - options_.threshold;
  return rel ? metric > best_ * (options_.threshold + 1.0) : metric > best_ + options_.threshold;
}

void ReduceLROnPlateau::step(double metric) {
  if (is_better(metric)) {
    best_ = metric;
    num_bad_epochs_ = 0;
  } else {
    ++num_bad_epochs_;
  }
  if (in_cooldown()) {
    --cooldown_counter_;
    num_bad_epochs_ = 0;  // bad steps in the cooldown don't count
  }
  if (num_bad_epochs_ > options_.patience) {
    auto& groups = optimizer().param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const double old_lr = groups[g].lr();
      const double new_lr = std::max(old_lr * options_.factor, min_lrs_[g]);
      if (old_lr - new_lr > options_.eps) groups[g].set_lr(new_lr);
    }
    cooldown_counter_ = options_.cooldown;
    num_bad_epochs_ = 0;
  }
  record(last_epoch() + 1);
}

void ReduceLROnPlateau::save_extra(StateDict& dict) const {
  dict.scalars["best"] = best_;
  dict.scalars["num_bad_epochs"] = static_cast<double>(num_bad_epochs_);
  dict.scalars["cooldown_counter"] = static_cast<double>(cooldown_counter_);
}

void ReduceLROnPlateau::restore(const StateDict& dict, int64_t /*epoch*/) {
  const auto counter = [&](const char* key) {
    const double v = dict.scalars.at(key);
    EMBER_CHECK(v >= 0 && v == std::floor(v), name(), "load_state_dict: \"", key,
                "\" must be a count, got ", v);
    return static_cast<int64_t>(v);
  };
  const int64_t bad = counter("num_bad_epochs");
  const int64_t cooldown = counter("cooldown_counter");
  std::vector<double> lrs;
  for (size_t g = 0; g < base_lrs_.size(); ++g)
    lrs.push_back(dict.scalars.at(group_key("last_lr", g)));
  set_lrs(lrs);
  best_ = dict.scalars.at("best");
  num_bad_epochs_ = bad;
  cooldown_counter_ = cooldown;
}

// --- CosineWithWarmupLR --------------------------------------------------------------------

CosineWithWarmupLR::CosineWithWarmupLR(Optimizer& optimizer, int64_t warmup_steps,
                                       int64_t max_steps, double min_lr)
    : LRScheduler("CosineWithWarmupLR", optimizer),
      warmup_steps_(warmup_steps),
      max_steps_(max_steps),
      min_lr_(min_lr) {
  EMBER_CHECK(warmup_steps >= 0, name(), "warmup_steps must be >= 0, got ", warmup_steps);
  EMBER_CHECK(max_steps > warmup_steps, name(), "max_steps (", max_steps,
              ") must be larger than warmup_steps (", warmup_steps, ")");
  EMBER_CHECK(min_lr >= 0, name(), "min_lr must be >= 0, got ", min_lr);
  for (size_t g = 0; g < base_lrs_.size(); ++g) {
    EMBER_CHECK(min_lr <= base_lrs_[g], name(), "min_lr ", min_lr, " is larger than the lr ",
                base_lrs_[g], " of group ", g);
  }
  start();
}

std::vector<double> CosineWithWarmupLR::lr_at(int64_t epoch) const {
  std::vector<double> lrs;
  for (double base : base_lrs_) {
    if (epoch < warmup_steps_) {
      lrs.push_back(base * static_cast<double>(epoch) / static_cast<double>(warmup_steps_));
    } else if (epoch > max_steps_) {
      lrs.push_back(min_lr_);
    } else {
      const double ratio = static_cast<double>(epoch - warmup_steps_) /
                           static_cast<double>(max_steps_ - warmup_steps_);
      lrs.push_back(min_lr_ + 0.5 * (1.0 + std::cos(std::numbers::pi * ratio)) * (base - min_lr_));
    }
  }
  return lrs;
}

}  // namespace ember::optim

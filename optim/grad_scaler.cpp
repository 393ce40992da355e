#include "grad_scaler.h"

#include <cmath>
#include <iterator>

#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/ops_amp.h>

namespace ember::optim {

bool ScaledStep::ran() const { return decided() ? ran_ : found_inf_.item<float>() == 0.f; }

GradScaler::GradScaler(GradScalerOptions options, FoundInfReducer reducer)
    : init_scale_(options.init_scale),
      growth_factor_(options.growth_factor),
      backoff_factor_(options.backoff_factor),
      growth_interval_(options.growth_interval),
      enabled_(options.enabled),
      reducer_(std::move(reducer)) {
  EMBER_CHECK(std::isfinite(init_scale_) && init_scale_ > 0, "GradScaler",
              "init_scale must be positive and finite, got ", init_scale_);
  check_factors(growth_factor_, backoff_factor_, growth_interval_);
}

void GradScaler::check_factors(double growth_factor, double backoff_factor, int64_t interval) {
  EMBER_CHECK(growth_factor > 1.0 && std::isfinite(growth_factor), "GradScaler",
              "growth_factor must be > 1, got ", growth_factor);
  EMBER_CHECK(backoff_factor > 0.0 && backoff_factor < 1.0, "GradScaler",
              "backoff_factor must be in (0, 1), got ", backoff_factor);
  EMBER_CHECK(interval > 0, "GradScaler", "growth_interval must be positive, got ", interval);
}

void GradScaler::check_scale_created(const char* op) const {
  EMBER_CHECK(scale_.defined(), op,
              "the scale is not set: call scaler.scale(loss) earlier in the iteration");
}

Tensor GradScaler::scale(const Tensor& outputs) {
  if (!enabled_) return outputs;
  EMBER_CHECK(outputs.defined(), "GradScaler::scale", "outputs is undefined");
  EMBER_CHECK(outputs.is_floating_point(), "GradScaler::scale",
              "expected a floating tensor, got dtype ", outputs.dtype());
  if (!scale_.defined()) {
    NoGradGuard no_grad;
    scale_ = full({}, init_scale_, TensorOptions(kF32, outputs.device()));
    growth_tracker_ = full({}, init_growth_tracker_, TensorOptions(kI32, outputs.device()));
  }
  const DType dtype = promote_types(outputs.dtype(), kF32);
  return mul(outputs.dtype() == dtype ? outputs : outputs.to(dtype), scale_.to(outputs.device()));
}

std::vector<Tensor> GradScaler::scale(const std::vector<Tensor>& outputs) {
  std::vector<Tensor> scaled;
  scaled.reserve(outputs.size());
  for (const Tensor& t : outputs) scaled.push_back(scale(t));
  return scaled;
}

void GradScaler::unscale_(Optimizer& optimizer) {
  if (!enabled_) return;
  check_scale_created("GradScaler::unscale_");
  PerOptimizer& state = per_optimizer_[&optimizer];
  EMBER_CHECK(state.stage != Stage::kUnscaled, "GradScaler::unscale_",
              "unscale_() has already been called on this optimizer since the last update()");
  EMBER_CHECK(state.stage != Stage::kStepped, "GradScaler::unscale_",
              "unscale_() is being called after step()");
  check_gradients(optimizer, state, true);
  state.stage = Stage::kUnscaled;
}

Tensor GradScaler::check_gradients(Optimizer& optimizer, PerOptimizer& state, bool unscale) {
  NoGradGuard no_grad;
  // 1 / scale in double, then f32, as PyTorch computes it.
  const Tensor inv_scale =
      div(scalar_tensor(1.0, TensorOptions(kF64, scale_.device())), scale_.to(kF64)).to(kF32);
  std::vector<std::pair<Device, std::vector<Tensor>>> by_device;
  for (const ParamGroup& group : optimizer.param_groups()) {
    for (const Tensor& p : group.params) {
      const Tensor g = p.grad();
      if (!g.defined()) continue;
      EMBER_CHECK(g.dtype() != kF16, "GradScaler::unscale_",
                  "attempting to unscale f16 gradients: keep parameters and their gradients in "
                  "f32 and let autocast run the f16 math");
      auto it = by_device.begin();
      while (it != by_device.end() && !(it->first == g.device())) ++it;
      if (it == by_device.end()) {
        by_device.emplace_back(g.device(), std::vector<Tensor>{});
        it = std::prev(by_device.end());
      }
      it->second.push_back(g);
    }
  }
  // Multiplying by exactly 1 writes nothing: the check alone.
  const Tensor factor = unscale ? inv_scale : ones({}, TensorOptions(kF32, scale_.device()));
  state.found_inf.clear();
  for (auto& [device, grads] : by_device) {
    const Tensor found_inf = zeros({}, TensorOptions(kF32, device));
    amp_foreach_non_finite_check_and_unscale_(grads, found_inf, factor.to(device));
    if (reducer_) reducer_(found_inf);
    state.found_inf.emplace_back(device, found_inf);
  }
  // A rank with no gradient here (a ZeRO-2 rank that owns none) still takes part in the
  // agreement, so every rank issues the same collectives; it records no check of its own.
  if (by_device.empty() && reducer_) reducer_(zeros({}, TensorOptions(kF32, scale_.device())));
  optimizer.agree_found_inf(state.found_inf);  // a sharded optimizer's ranks decide together
  return inv_scale;
}

Tensor GradScaler::found_inf_of(const PerOptimizer& state) const {
  NoGradGuard no_grad;
  Tensor combined;
  for (const auto& entry : state.found_inf) {
    const Tensor f = entry.second.to(scale_.device());
    combined = combined.defined() ? add(combined, f) : f;
  }
  return combined;
}

ScaledStep GradScaler::step(Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return ScaledStep(true);
  }
  check_scale_created("GradScaler::step");
  PerOptimizer& state = per_optimizer_[&optimizer];
  EMBER_CHECK(state.stage != Stage::kStepped, "GradScaler::step",
              "step() has already been called since the last update()");
  const bool on_device = optimizer.device_step_refusal().empty();
  Tensor inv_scale;  // stays undefined once unscale_ ran: the gradients are unscaled
  if (state.stage == Stage::kReady) inv_scale = check_gradients(optimizer, state, !on_device);
  EMBER_CHECK(!state.found_inf.empty(), "GradScaler::step",
              "no inf checks were recorded for this optimizer: none of its parameters has a "
              "gradient (did backward run on the scaled loss?)");
  const Tensor found = found_inf_of(state);
  if (on_device) {
    optimizer.step(StepScaling{inv_scale, found});
    state.stage = Stage::kStepped;
    return ScaledStep(found);
  }
  const bool run = found.item<float>() == 0.f;
  if (run) optimizer.step();
  state.stage = Stage::kStepped;
  return ScaledStep(run);
}

void GradScaler::update() {
  if (!enabled_) return;
  check_scale_created("GradScaler::update");
  Tensor combined;
  {
    NoGradGuard no_grad;
    for (const auto& [optimizer, state] : per_optimizer_) {
      const Tensor f = found_inf_of(state);
      if (f.defined()) combined = combined.defined() ? add(combined, f) : f;
    }
  }
  EMBER_CHECK(combined.defined(), "GradScaler::update",
              "no inf checks were recorded prior to update(): call step() or unscale_() first");
  amp_update_scale_(scale_, growth_tracker_, combined, growth_factor_, backoff_factor_,
                    growth_interval_);
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!enabled_) return;
  check_scale_created("GradScaler::update");
  EMBER_CHECK(std::isfinite(new_scale) && new_scale > 0, "GradScaler::update",
              "new_scale must be positive and finite, got ", new_scale);
  NoGradGuard no_grad;
  scale_.fill_(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const {
  if (!enabled_) return 1.0;
  return scale_.defined() ? scale_.item<double>() : init_scale_;
}

int64_t GradScaler::get_growth_tracker() const {
  if (!enabled_) return 0;
  return growth_tracker_.defined() ? growth_tracker_.item<int64_t>() : init_growth_tracker_;
}

void GradScaler::set_growth_factor(double factor) {
  check_factors(factor, backoff_factor_, growth_interval_);
  growth_factor_ = factor;
}

void GradScaler::set_backoff_factor(double factor) {
  check_factors(growth_factor_, factor, growth_interval_);
  backoff_factor_ = factor;
}

void GradScaler::set_growth_interval(int64_t interval) {
  check_factors(growth_factor_, backoff_factor_, interval);
  growth_interval_ = interval;
}

StateDict GradScaler::state_dict() const {
  StateDict dict;
  if (!enabled_) return dict;
  dict.scalars = {{"scale", get_scale()},
                  {"growth_factor", growth_factor_},
                  {"backoff_factor", backoff_factor_},
                  {"growth_interval", static_cast<double>(growth_interval_)},
                  {"_growth_tracker", static_cast<double>(get_growth_tracker())}};
  return dict;
}

void GradScaler::load_state_dict(const StateDict& dict) {
  if (!enabled_) return;
  EMBER_CHECK(!dict.scalars.empty(), "GradScaler::load_state_dict",
              "the state dict is empty, possibly because it was saved by a disabled GradScaler");
  auto get = [&](const char* key) {
    const auto it = dict.scalars.find(key);
    EMBER_CHECK(it != dict.scalars.end(), "GradScaler::load_state_dict", "missing key \"", key,
                "\"");
    return it->second;
  };
  const double scale = get("scale"), growth = get("growth_factor"), backoff = get("backoff_factor"),
               interval = get("growth_interval"), tracker = get("_growth_tracker");
  EMBER_CHECK(std::isfinite(scale) && scale > 0, "GradScaler::load_state_dict",
              "scale must be positive and finite, got ", scale);
  EMBER_CHECK(interval == std::floor(interval) && tracker == std::floor(tracker) && tracker >= 0,
              "GradScaler::load_state_dict", "growth_interval (", interval,
              ") and _growth_tracker (", tracker, ") must be whole numbers");
  check_factors(growth, backoff, static_cast<int64_t>(interval));
  init_scale_ = scale;
  growth_factor_ = growth;
  backoff_factor_ = backoff;
  growth_interval_ = static_cast<int64_t>(interval);
  init_growth_tracker_ = static_cast<int64_t>(tracker);
  NoGradGuard no_grad;
  if (scale_.defined()) scale_.fill_(scale);
  if (growth_tracker_.defined()) growth_tracker_.fill_(init_growth_tracker_);
}

}  // namespace ember::optim

// GradScaler: dynamic loss scaling for fp16 mixed precision, as torch.cuda.amp.GradScaler
// (torch.amp.GradScaler), on any device.
//
// fp16 gradients underflow; the scaler multiplies the loss by a large factor (2^16 at first)
// before backward and divides the gradients by it before the optimizer uses them. When any
// gradient holds inf or NaN the optimizer step is skipped and the scale halves; after
// growth_interval clean steps in a row it doubles.
//
//   optim::GradScaler scaler;                   // init_scale 65536, x2 / x0.5, interval 2000
//   {
//     AutocastGuard autocast(device, kF16);
//     loss = criterion(model(x), y);
//   }
//   scaler.scale(loss).backward();              // backward outside autocast
//   scaler.unscale_(opt);                       // optional: before clipping the true gradients
//   optim::clip_grad_norm_(params, 1.0);
//   scaler.step(opt);                           // skipped when a gradient is inf/NaN
//   scaler.update();
//
// The scale and growth tracker live in tensors on the loss's device; checking and unscaling
// every gradient is one fused op (on CUDA a multi-tensor pass per gradient dtype: a few
// launches for all gradients, none per parameter), and update() decides the new scale on the
// device. bf16 needs no scaler; an enabled one with bf16 is harmless. Under data parallelism
// pass a FoundInfReducer (dist::make_found_inf_agreement) so that every rank sees the same
// flag and all skip together. An optimizer holding a shard of the gradients
// (dist::ZeroRedundancyOptimizer under ZeRO-2) agrees its flags itself
// (Optimizer::agree_found_inf), with or without a reducer.
//
// NOTE: the fused path. When every parameter of the optimizer takes its multi-tensor update
// (optimizer.device_step_refusal() is empty: SGD/Adam/AdamW with foreach or fused, or on
// CUDA by default, once their state exists), step() reads nothing back, as PyTorch's
// scaler.step with a fused optimizer: one read-only inf/NaN pass over the gradients (none
// after unscale_), then the optimizer's pass multiplies each gradient by 1 / scale as it reads
// it and skips the update on the device when the flag is set (parameters, state and step
// counts unchanged). Its parameters end bit for bit where unscale_ + step() would leave them
// (CPU, f32 and f64). Otherwise step() unscales, reads the flag on the host and steps or not,
// as PyTorch's default path. Either way step() returns a ScaledStep.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include <ember/tensor/tensor.h>

#include "optimizer.h"

namespace ember::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // > 1
  double backoff_factor = 0.5;  // in (0, 1)
  int64_t growth_interval = 2000;
  bool enabled = true;  // false: scale() returns the loss, step() just steps, update() nothing
};

// What GradScaler::step returns: whether the optimizer's update ran. (PyTorch's scaler.step
// returns the optimizer's own return value, None for a step without a closure; ember answers
// the question its callers ask.) On the fused path the answer stays on the device until it is
// asked for: converting to bool reads it back (a wait on the GPU), so a training loop that
// never asks never waits.
class ScaledStep {
 public:
  explicit ScaledStep(bool ran) : ran_(ran) {}
  explicit ScaledStep(Tensor found_inf) : found_inf_(std::move(found_inf)) {}

  bool ran() const;
  operator bool() const { return ran(); }  // NOLINT: `if (scaler.step(opt))`, `bool ran = ...`
  // Whether ran() is known on the host (no device read).
  bool decided() const { return !found_inf_.defined(); }
  // Undecided: the flag that decided it on the device (1-element f32, nonzero: skipped).
  const Tensor& found_inf() const { return found_inf_; }

 private:
  bool ran_ = false;
  Tensor found_inf_;
};

class GradScaler {
 public:
  // Makes found_inf (a 1-element f32 tensor, 0 or 1) the same on every process, in place
  // (a max all-reduce). Called once per device by unscale_().
  using FoundInfReducer = std::function<void(const Tensor& found_inf)>;

  explicit GradScaler(GradScalerOptions options = {}, FoundInfReducer reducer = {});

  // outputs * scale (in at least f32, as PyTorch's f32 scale promotes). The scale is
  // created on the first call, on outputs' device. Disabled: outputs unchanged.
  Tensor scale(const Tensor& outputs);
  std::vector<Tensor> scale(const std::vector<Tensor>& outputs);

  // Divides the optimizer's gradients by the scale in place and records whether any is
  // inf/NaN. At most once per optimizer between update()s, before step(); ember::Error on a
  // second call or after step(), or when a gradient is f16 (keep master gradients f32).
  void unscale_(Optimizer& optimizer);

  // Unscales (if unscale_ was not called) and runs optimizer.step() unless an inf/NaN was
  // found: on the device where the optimizer allows it (the fused path above), else with a
  // host read. Returns whether the step ran. Once per optimizer between update()s;
  // ember::Error when no parameter of the optimizer has a gradient, as PyTorch.
  ScaledStep step(Optimizer& optimizer);

  // Backs the scale off (found inf in any optimizer this iteration) or grows it after
  // growth_interval clean steps, on the device; then starts the next iteration.
  // update(new_scale) sets the scale instead (positive, finite).
  void update();
  void update(double new_scale);

  // The current scale (a host read); init_scale before the first scale(); 1 when disabled.
  double get_scale() const;
  // Clean steps since the last growth or backoff.
  int64_t get_growth_tracker() const;
  double get_growth_factor() const { return growth_factor_; }
  double get_backoff_factor() const { return backoff_factor_; }
  int64_t get_growth_interval() const { return growth_interval_; }
  void set_growth_factor(double factor);
  void set_backoff_factor(double factor);
  void set_growth_interval(int64_t interval);
  bool is_enabled() const { return enabled_; }

  // PyTorch's keys: "scale", "growth_factor", "backoff_factor", "growth_interval",
  // "_growth_tracker" (scalars). Empty when disabled.
  StateDict state_dict() const;
  // Restores the above; ember::Error on an empty dict (saved by a disabled scaler) or a
  // missing key. Does nothing when disabled.
  void load_state_dict(const StateDict& dict);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct PerOptimizer {
    Stage stage = Stage::kReady;
    std::vector<std::pair<Device, Tensor>> found_inf;  // one flag per gradient device
  };

  void check_scale_created(const char* op) const;
  // Checks the optimizer's gradients for inf/NaN into state.found_inf (one flag per device),
  // dividing them by the scale when `unscale`; returns 1 / scale (1-element f32).
  Tensor check_gradients(Optimizer& optimizer, PerOptimizer& state, bool unscale);
  // The optimizer's flags summed on the scale's device (undefined when none was recorded).
  Tensor found_inf_of(const PerOptimizer& state) const;
  static void check_factors(double growth_factor, double backoff_factor, int64_t interval);

  double init_scale_;
  double growth_factor_;
  double backoff_factor_;
  int64_t growth_interval_;
  int64_t init_growth_tracker_ = 0;
  bool enabled_;
  FoundInfReducer reducer_;
  Tensor scale_;           // 0-d f32 on the loss's device, once scale() ran
  Tensor growth_tracker_;  // 0-d i32 beside it
  std::map<const Optimizer*, PerOptimizer> per_optimizer_;
};

}  // namespace ember::optim

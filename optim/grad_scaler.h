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
// launches for all gradients, none per parameter). step() reads the inf flag on the
// host, as PyTorch's does. bf16 needs no scaler; an enabled one with bf16 is harmless.
// Under data parallelism pass a FoundInfReducer (dist::make_found_inf_agreement) so that
// every rank sees the same flag and all skip together.
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
  // found. Returns whether the step ran. Once per optimizer between update()s; ember::Error
  // when no parameter of the optimizer has a gradient, as PyTorch.
  bool step(Optimizer& optimizer);

  // Backs the scale off (found inf in any optimizer this iteration) or grows it after
  // growth_interval clean steps; then starts the next iteration. update(new_scale) sets the
  // scale instead (positive, finite).
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

// ember-train's --precision: which arithmetic a training step runs in, wired once.
//   fp32  full f32 (TF32 off for cuBLAS and cuDNN)
//   tf32  f32 storage, TF32 tensor cores for matmuls and convolutions (CUDA; the CPU runs f32)
//   bf16  autocast to bf16 for forward and loss (backward outside it, as PyTorch recommends)
//   fp16  autocast to f16, with a GradScaler (dynamic loss scale, inf/NaN steps skipped)
//   auto  bf16 on a GPU that has it (compute capability >= 8.0), else fp32
// Parameters, gradients, optimizer state, DDP buckets and checkpoints stay f32 in every mode,
// so a checkpoint loads into any precision.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <ember/optim/grad_scaler.h>
#include <ember/optim/optimizer.h>
#include <ember/tensor/autocast.h>
#include <ember/tensor/precision.h>

namespace ember::apps {

enum class Precision { kFP32, kTF32, kBF16, kFP16 };

// "auto" resolved for `device`, or the named mode; ember::Error naming an unknown value.
Precision resolve_precision(const std::string& name, Device device);
const char* precision_name(Precision precision);

// One run's precision: the TF32 policy (fp32/tf32, restored on destruction), the autocast
// scope for forward + loss (bf16/fp16) and the scaler (fp16) around backward and step.
class PrecisionContext {
 public:
  // reducer: how ranks agree on the scaler's found-inf flag (dist::make_found_inf_agreement);
  // empty for one process.
  PrecisionContext(Precision precision, Device device,
                   optim::GradScaler::FoundInfReducer reducer = {});

  Precision precision() const { return precision_; }
  const char* name() const { return precision_name(precision_); }

  // Autocast for the forward pass and the loss (null in fp32/tf32): hold it for that scope.
  std::unique_ptr<AutocastGuard> autocast() const;
  // The loss to call backward() on: scaled in fp16, else the loss itself.
  Tensor scale(const Tensor& loss);
  // Before clipping: the gradients divided by the scale (fp16; else nothing to do).
  void unscale_(optim::Optimizer& optimizer);
  // optimizer.step(), skipped in fp16 when a gradient is inf/NaN; then the scale's update.
  // Returns whether the step ran; on the scaler's fused path the answer stays on the device
  // (nothing here reads it back, so a step never waits and can be graph-captured).
  optim::ScaledStep step(optim::Optimizer& optimizer);

  // The scaler in fp16 (what checkpoints save), else null.
  optim::GradScaler* scaler() { return scaler_ ? &*scaler_ : nullptr; }
  // The current loss scale in fp16, else 1.
  double loss_scale() const { return scaler_ ? scaler_->get_scale() : 1.0; }
  // Optimizer steps skipped for inf/NaN gradients in this process (reads the device count).
  int64_t skipped_steps() const;

 private:
  Precision precision_;
  Device device_;
  std::optional<Float32PrecisionGuard> tf32_policy_;
  std::optional<optim::GradScaler> scaler_;
  int64_t skipped_ = 0;       // steps the scaler skipped with a host read
  Tensor skipped_on_device_;  // fp16: 0-d f32, steps skipped on the fused path (added in place)
};

}  // namespace ember::apps

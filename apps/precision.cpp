#include "precision.h"

#include <ember/tensor/cuda.h>
#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

namespace ember::apps {

Precision resolve_precision(const std::string& name, Device device) {
  if (name == "fp32") return Precision::kFP32;
  if (name == "tf32") return Precision::kTF32;
  if (name == "bf16") return Precision::kBF16;
  if (name == "fp16") return Precision::kFP16;
  EMBER_CHECK(name == "auto", "--precision", "unknown precision \"", name,
              "\" (expected auto, fp32, tf32, bf16 or fp16)");
  if (device.is_cuda() && cuda::device_capability(device.index).first >= 8) {
    return Precision::kBF16;
  }
  return Precision::kFP32;
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kFP32:
      return "fp32";
    case Precision::kTF32:
      return "tf32";
    case Precision::kBF16:
      return "bf16";
    case Precision::kFP16:
      return "fp16";
  }
  return "fp32";
}

PrecisionContext::PrecisionContext(Precision precision, Device device,
                                   optim::GradScaler::FoundInfReducer reducer)
    : precision_(precision), device_(device) {
  if (precision == Precision::kFP32) tf32_policy_.emplace("highest", false);
  if (precision == Precision::kTF32) tf32_policy_.emplace("high", true);
  if (precision == Precision::kFP16) {
    scaler_.emplace(optim::GradScalerOptions{}, std::move(reducer));
    // Made here, outside any graph capture, so a captured step adds to it in place.
    skipped_on_device_ = zeros({}, TensorOptions(kF32, device));
  }
}

std::unique_ptr<AutocastGuard> PrecisionContext::autocast() const {
  if (precision_ == Precision::kBF16) return std::make_unique<AutocastGuard>(device_, kBF16);
  if (precision_ == Precision::kFP16) return std::make_unique<AutocastGuard>(device_, kF16);
  return nullptr;
}

Tensor PrecisionContext::scale(const Tensor& loss) { return scaler_ ? scaler_->scale(loss) : loss; }

void PrecisionContext::unscale_(optim::Optimizer& optimizer) {
  if (scaler_) scaler_->unscale_(optimizer);
}

optim::ScaledStep PrecisionContext::step(optim::Optimizer& optimizer) {
  if (!scaler_) {
    optimizer.step();
    return optim::ScaledStep(true);
  }
  const optim::ScaledStep ran = scaler_->step(optimizer);
  scaler_->update();
  if (ran.decided()) {
    if (!ran) ++skipped_;
  } else {
    NoGradGuard no_grad;
    skipped_on_device_.add_(clamp(ran.found_inf().reshape({}), {}, 1.0));
  }
  return ran;
}

int64_t PrecisionContext::skipped_steps() const {
  if (!skipped_on_device_.defined()) return skipped_;
  return skipped_ + static_cast<int64_t>(skipped_on_device_.item<float>());
}

}  // namespace ember::apps

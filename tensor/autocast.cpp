#include "autocast.h"

#include "error.h"

namespace ember {

namespace {

struct AutocastState {
  bool enabled[kNumDeviceTypes] = {false, false};
  DType dtype[kNumDeviceTypes] = {kBF16, kF16};  // PyTorch's defaults: CPU bf16, CUDA f16
  int depth = 0;                                 // live guards on this thread
};
thread_local AutocastState state;

}  // namespace

AutocastGuard::AutocastGuard(Device device, DType dtype, bool enabled)
    : type_(device.type),
      previous_enabled_(state.enabled[static_cast<int>(device.type)]),
      previous_dtype_(state.dtype[static_cast<int>(device.type)]) {
  EMBER_CHECK(!enabled || dtype == kBF16 || dtype == kF16, "AutocastGuard",
              "autocast runs in bf16 or f16, got ", dtype, " for ", device);
  const int t = static_cast<int>(type_);
  state.enabled[t] = enabled;
  if (enabled) state.dtype[t] = dtype;
  ++state.depth;
}

AutocastGuard::~AutocastGuard() {
  const int t = static_cast<int>(type_);
  state.enabled[t] = previous_enabled_;
  state.dtype[t] = previous_dtype_;
  --state.depth;
}

bool is_autocast_enabled(DeviceType type) { return state.enabled[static_cast<int>(type)]; }
DType autocast_dtype(DeviceType type) { return state.dtype[static_cast<int>(type)]; }

}  // namespace ember

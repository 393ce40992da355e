// Automatic mixed precision (torch.autocast): inside an AutocastGuard, ops on the guarded
// device type run in the policy's precision. Matmul-like ops (conv, linear, matmul, bmm,
// addmm) cast their floating inputs to the low dtype (bf16 or f16); numerically sensitive ops
// (norm statistics, softmax, log_softmax, losses, sum/mean, exp/log/pow) run in f32; ops
// with several inputs (add, cat, ...) promote to the widest input. Each op's descriptor
// (EMBER_OP in its file) holds its rule; README's autocast table lists them at one glance.
//
// State is per thread, like PyTorch's. Guards nest: an inner guard replaces the outer one's
// setting for its scope (an inner AutocastGuard(dev, dtype, false) turns autocast off, as
// torch.autocast(enabled=False) does) and restores it on exit. Casts of the same leaf tensor
// that requires grad (a weight) are cached while the outermost enabled guard lives, so a
// weight used by several ops in one forward is cast once; the cache is dropped when that
// guard exits.
//
// Gradients flow back through the casts: f32 leaves receive f32 gradients.
#pragma once

#include "device.h"
#include "dtype.h"

namespace ember {

class AutocastGuard {
 public:
  // dtype must be kBF16 or kF16 (throws ember::Error otherwise, when enabled).
  AutocastGuard(Device device, DType dtype, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DeviceType type_;
  bool previous_enabled_;
  DType previous_dtype_;
};

// Whether autocast is on for tensors on devices of this type, on this thread.
bool is_autocast_enabled(DeviceType type);
// The low dtype autocast uses for this device type (PyTorch's defaults when no guard has
// set one: bf16 on the CPU, f16 on CUDA).
DType autocast_dtype(DeviceType type);

}  // namespace ember

// What the CPU kernel files (tensor/cpu/NAME.cpp) share: their registration macros and the
// OpenMP grain.
#pragma once

#include "../detail/kernel_table.h"

// This file's entries of the CPU kernel table, filled at start-up:
//   EMBER_REGISTER_CPU_KERNELS(NAME) { table.entry = entry_cpu; ... }
#define EMBER_REGISTER_CPU_KERNELS(name) \
  EMBER_REGISTER_TABLE_KERNELS(::ember::DeviceType::kCPU, register_cpu_##name##_kernels)
// An op's own CPU kernel (OpKernels, kernel_table.h).
#define EMBER_REGISTER_CPU_KERNEL(kernels, fn) \
  EMBER_REGISTER_OWN_KERNEL(kernels, ::ember::DeviceType::kCPU, fn)

namespace ember::detail {

// Splits [0, n) across OpenMP threads when n elements are worth it (a grain of work each).
inline constexpr int64_t kParallelGrain = 32768;

}  // namespace ember::detail

// What every kernel file includes for the CUDA language: the CUDA runtime and ember's checks
// under nvcc, or, with EMBER_CUDA_EMULATED, their CPU emulation (emulated/emulate.h, which
// says how kernels run there). Both define
//   EMBER_LAUNCH(grid, block, shared_bytes, stream, kernel)(args...)  a kernel launch
//   EMBER_SHARED(type, name, [dims])    the block's shared type name[dims]
//   EMBER_DYNAMIC_SHARED(type, name)    the block's dynamic shared memory as type name[]
//   EMBER_KERNELS_BEGIN / EMBER_KERNELS_END    open / close the kernels' namespace
//   EMBER_REGISTER_CUDA_KERNELS(NAME) { table.entry = entry_cuda; ... }   this file's entries
//       of the CUDA kernel table, filled at start-up (kernel_table.h); when emulated, only
//       the function register_cuda_NAME_kernels(table), which a test runs on a table of its
//       own while libember's real kernels stay registered
//   EMBER_REGISTER_CUDA_KERNEL(kernels, fn)    an op's own CUDA kernel (kernel_table.h's
//       EMBER_REGISTER_OWN_KERNEL); nothing when emulated, where a test reaches fn directly
// Private to tensor/cuda/.
#pragma once

#if defined(EMBER_CUDA_EMULATED)
#include "emulated/emulate.h"
#else
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "cuda_context.h"

#define EMBER_LAUNCH(grid, block, shared_bytes, stream, ...) \
  __VA_ARGS__<<<grid, block, shared_bytes, stream>>>
#define EMBER_SHARED(type, name, dims) __shared__ type name dims
#define EMBER_DYNAMIC_SHARED(type, name) extern __shared__ __align__(16) type name[]
#define EMBER_KERNELS_BEGIN namespace ember::detail {
#define EMBER_KERNELS_END }
#endif

#include "../detail/kernel_table.h"

#if defined(EMBER_CUDA_EMULATED)
#define EMBER_REGISTER_CUDA_KERNELS(name) \
  void register_cuda_##name##_kernels(::ember::detail::KernelTable& table)
#define EMBER_REGISTER_CUDA_KERNEL(kernels, fn) static_assert(true)
#else
#define EMBER_REGISTER_CUDA_KERNELS(name) \
  EMBER_REGISTER_TABLE_KERNELS(::ember::DeviceType::kCUDA, register_cuda_##name##_kernels)
#define EMBER_REGISTER_CUDA_KERNEL(kernels, fn) \
  EMBER_REGISTER_OWN_KERNEL(kernels, ::ember::DeviceType::kCUDA, fn)
#endif

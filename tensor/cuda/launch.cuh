// What every ember CUDA kernel file shares: launch geometry, element casts and a grid-stride
// elementwise launcher over a StridedIter (math runs in detail/dispatch.h's acc_t). Private to
// tensor/cuda/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "../detail/dispatch.h"
#include "../detail/tensor_iter.h"
#include "../dtype.h"
#include "device.cuh"

EMBER_KERNELS_BEGIN

inline constexpr int kBlockSize = 256;
// Grid-stride loops cover the rest (emulated: a few blocks, so small tests take the loops).
#if defined(EMBER_CUDA_EMULATED)
inline constexpr int64_t kMaxGridBlocks = cuda_emu::kEmulatedMaxGridBlocks;
#else
inline constexpr int64_t kMaxGridBlocks = 65536;
#endif

// Blocks for n elements, one per thread; never 0 for n > 0.
inline unsigned grid_for(int64_t n, int block = kBlockSize) {
  return static_cast<unsigned>(std::min<int64_t>((n + block - 1) / block, kMaxGridBlocks));
}

__device__ __forceinline__ int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

template <typename T>
inline constexpr bool kIsHalfLike = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// A value of one element type as another: 16-bit floats pass through float, bool is != 0.
template <typename To, typename From>
__host__ __device__ __forceinline__ To cast_to(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (kIsHalfLike<From>) {
    return cast_to<To>(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From(0);
  } else if constexpr (kIsHalfLike<To>) {
    return To(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

// Element offsets of linear index i for each of NumOps operands.
template <int NumOps>
__device__ __forceinline__ void iter_offsets(const StridedIter& it, int64_t i, int64_t* offsets) {
#pragma unroll
  for (int op = 0; op < NumOps; ++op) offsets[op] = 0;
  for (int d = it.ndim - 1; d >= 0; --d) {
    const int64_t size = it.sizes[d];
    const int64_t index = i % size;
    i /= size;
#pragma unroll
    for (int op = 0; op < NumOps; ++op) offsets[op] += index * it.strides[op][d];
  }
}

// f(data, offsets) for every element of `it`; data[k] + offsets[k] (in elements of operand
// k's type) addresses operand k.
template <bool Contiguous, int NumOps, typename F>
__global__ void elementwise_kernel(const __grid_constant__ StridedIter it, const F f) {
  for (int64_t i = global_thread(); i < it.numel; i += grid_stride()) {
    int64_t offsets[NumOps];
    if constexpr (Contiguous) {
#pragma unroll
      for (int op = 0; op < NumOps; ++op) offsets[op] = i;
    } else {
      iter_offsets<NumOps>(it, i, offsets);
    }
    f(it.data, offsets);
  }
}

template <int NumOps, typename F>
void launch_elementwise(const StridedIter& it, cudaStream_t stream, const F& f) {
  if (it.numel == 0) return;
  EMBER_ASSERT(it.num_operands == NumOps, "elementwise launch with ", it.num_operands,
               " operands, expected ", NumOps);
  const unsigned grid = grid_for(it.numel);
  if (it.contiguous) {
    EMBER_LAUNCH(grid, kBlockSize, 0, stream, elementwise_kernel<true, NumOps>)(it, f);
  } else {
    EMBER_LAUNCH(grid, kBlockSize, 0, stream, elementwise_kernel<false, NumOps>)(it, f);
  }
  EMBER_CUDA_CHECK_LAUNCH();
}

template <typename T>
__device__ __forceinline__ T& element(char* const* data, const int64_t* offsets, int op) {
  return reinterpret_cast<T*>(data[op])[offsets[op]];
}

EMBER_KERNELS_END  // namespace ember::detail

// A fixed-order block-wide sum, so per-channel reductions do not depend on timing. Private
// to tensor/cuda/.
#pragma once

#include "device.cuh"

EMBER_KERNELS_BEGIN

// Sums one value per thread over a block of exactly Block threads (a power of two); every
// thread gets the total. `shared` holds Block values and may be reused after the call.
template <int Block, typename A>
__device__ __forceinline__ A block_sum(A value, A* shared) {
  static_assert((Block & (Block - 1)) == 0, "block_sum needs a power-of-two block");
  shared[threadIdx.x] = value;
  __syncthreads();
#pragma unroll
  for (int half = Block / 2; half > 0; half >>= 1) {
    if (static_cast<int>(threadIdx.x) < half) shared[threadIdx.x] += shared[threadIdx.x + half];
    __syncthreads();
  }
  const A total = shared[0];
  __syncthreads();  // everyone has read shared[0] before the next use overwrites it
  return total;
}

EMBER_KERNELS_END  // namespace ember::detail

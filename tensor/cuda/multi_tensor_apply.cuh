// Multi-tensor apply: one kernel launch over many tensors (optimizer updates, gradient
// unscaling, norms), as PyTorch's multi_tensor_apply. The host packs up to MaxTensors tensor
// addresses (Depth lists: e.g. param, grad, exp_avg, ...) and up to kMultiTensorMaxBlocks
// chunk assignments into one kernel argument; each block then handles kMultiTensorChunk
// elements of one tensor. Tensors that do not fit go to the next launch (a large tensor may
// be split across launches: detail/multi_tensor_plan.h). Everything a launch needs travels
// in its arguments (no host-to-device copy), so the launches can be captured in a CUDA graph.
// Private to tensor/cuda/.
//
//   struct Op {  // any device-callable functor
//     __device__ void operator()(const TensorListMeta<2, Extra, 48>& meta, int tensor,
//                                int64_t begin, int64_t end) const;
//   };
//   multi_tensor_apply<2, Extra, 48>(stream, addresses, numels, extras, Op{...});
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "../detail/multi_tensor_plan.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN

inline constexpr int64_t kMultiTensorChunk = 65536;
inline constexpr int kMultiTensorMaxBlocks = 320;
inline constexpr int kMultiTensorBlockSize = 512;

struct NoExtra {};

// One launch's work: Depth lists of MaxTensors addresses with their sizes and per-tensor
// extras (scalars that differ between tensors), and for every block the tensor (a slot) and
// the chunk of it it updates.
template <int Depth, typename Extra, int MaxTensors>
struct TensorListMeta {
  void* addresses[Depth][MaxTensors];
  int64_t numel[MaxTensors];
  Extra extra[MaxTensors];
  uint8_t block_to_tensor[kMultiTensorMaxBlocks];
  int32_t block_to_chunk[kMultiTensorMaxBlocks];
};

template <int Depth, typename Extra, int MaxTensors, typename Op>
__global__ void __launch_bounds__(kMultiTensorBlockSize)
    multi_tensor_kernel(const __grid_constant__ TensorListMeta<Depth, Extra, MaxTensors> meta,
                        const Op op) {
  const int tensor = meta.block_to_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(meta.block_to_chunk[blockIdx.x]) * kMultiTensorChunk;
  const int64_t end = begin + kMultiTensorChunk < meta.numel[tensor] ? begin + kMultiTensorChunk
                                                                     : meta.numel[tensor];
  op(meta, tensor, begin, end);
}

// Runs `op` over every element of every tensor; addresses[i][d] is tensor i's pointer in list
// d. Tensors with no elements are skipped. MaxTensors must fit the slot index (uint8) and
// the whole argument the 4 KiB every CUDA version accepts.
template <int Depth, typename Extra, int MaxTensors, typename Op>
void multi_tensor_apply(cudaStream_t stream, std::span<const std::array<void*, Depth>> addresses,
                        std::span<const int64_t> numels, std::span<const Extra> extras,
                        const Op& op) {
  using Meta = TensorListMeta<Depth, Extra, MaxTensors>;
  static_assert(MaxTensors <= 255, "tensor slots are numbered by uint8");
  static_assert(sizeof(Meta) <= 4000, "multi-tensor kernel argument over 4 KiB");
  EMBER_ASSERT(addresses.size() == numels.size() && extras.size() == numels.size(),
               "multi_tensor_apply: ", addresses.size(), " address rows, ", numels.size(),
               " sizes, ", extras.size(), " extras");
  plan_multi_tensor_launches(
      numels, kMultiTensorChunk, MaxTensors, kMultiTensorMaxBlocks,
      [&](const MultiTensorLaunch& launch) {
        Meta meta{};
        for (size_t slot = 0; slot < launch.slots.size(); ++slot) {
          const size_t t = launch.slots[slot];
          for (int d = 0; d < Depth; ++d) meta.addresses[d][slot] = addresses[t][d];
          meta.numel[slot] = numels[t];
          meta.extra[slot] = extras[t];
        }
        for (size_t b = 0; b < launch.blocks.size(); ++b) {
          meta.block_to_tensor[b] = static_cast<uint8_t>(launch.blocks[b].slot);
          meta.block_to_chunk[b] = static_cast<int32_t>(launch.blocks[b].chunk);
        }
        const auto blocks = static_cast<unsigned>(launch.blocks.size());
        EMBER_LAUNCH(blocks, kMultiTensorBlockSize, 0, stream,
                     multi_tensor_kernel<Depth, Extra, MaxTensors, Op>)
        (meta, op);
        EMBER_CUDA_CHECK_LAUNCH();
      });
}

// Slot `tensor`'s pointer in list `d`, as T*.
template <typename T, int Depth, typename Extra, int MaxTensors>
__device__ __forceinline__ T* list_ptr(const TensorListMeta<Depth, Extra, MaxTensors>& meta, int d,
                                       int tensor) {
  return static_cast<T*>(meta.addresses[d][tensor]);
}

EMBER_KERNELS_END  // namespace ember::detail

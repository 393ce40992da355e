// How multi-tensor apply (tensor/cuda/multi_tensor_apply.cuh) packs tensors into launches:
// host-only, so that the packing is tested without a GPU.
//
// Every tensor with elements is cut into chunks of `chunk` elements; a launch holds at most
// `max_tensors` tensors (slots) and `max_blocks` chunks (one block each). A tensor whose
// chunks do not all fit goes on in the next launch, in slot 0; empty tensors are skipped.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "../error.h"

namespace ember::detail {

struct MultiTensorLaunch {
  std::vector<size_t> slots;  // slot -> index of the tensor in the caller's lists
  struct Block {
    int slot;
    int64_t chunk;  // chunk index within the tensor
  };
  std::vector<Block> blocks;
};

// Calls on_launch(const MultiTensorLaunch&) once per launch, in order.
template <typename F>
void plan_multi_tensor_launches(std::span<const int64_t> numels, int64_t chunk, int max_tensors,
                                int max_blocks, const F& on_launch) {
  EMBER_ASSERT(chunk > 0 && max_tensors > 0 && max_blocks > 0, "multi-tensor plan: chunk ", chunk,
               ", max_tensors ", max_tensors, ", max_blocks ", max_blocks);
  MultiTensorLaunch launch;
  for (size_t t = 0; t < numels.size(); ++t) {
    if (numels[t] == 0) continue;
    launch.slots.push_back(t);
    int slot = static_cast<int>(launch.slots.size()) - 1;
    const int64_t chunks = (numels[t] + chunk - 1) / chunk;
    for (int64_t c = 0; c < chunks; ++c) {
      launch.blocks.push_back({slot, c});
      const bool last_chunk = c == chunks - 1;
      const bool tensors_full = static_cast<int>(launch.slots.size()) == max_tensors;
      if (static_cast<int>(launch.blocks.size()) == max_blocks || (tensors_full && last_chunk)) {
        on_launch(static_cast<const MultiTensorLaunch&>(launch));
        launch.blocks.clear();
        launch.slots.clear();
        if (!last_chunk) {  // the tensor goes on in the next launch, in slot 0
          launch.slots.push_back(t);
          slot = 0;
        }
      }
    }
  }
  if (!launch.blocks.empty()) on_launch(static_cast<const MultiTensorLaunch&>(launch));
}

}  // namespace ember::detail

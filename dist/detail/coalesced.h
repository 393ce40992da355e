// Tensors of one dtype and device packed into few collectives (DDP's buffers and parameters,
// ZeroRedundancyOptimizer's updated shards).
#pragma once

#include <cstddef>
#include <vector>

#include <ember/dist/process_group.h>

namespace ember::dist::detail {

class JoinChannel;

// Rank `root`'s values into `tensors` on every rank, as few broadcasts as possible: tensors
// of one dtype and device travel packed together, in pieces of at most `piece_bytes` through
// one buffer per kind (so the extra memory is one piece: on NCCL, whose wait only orders the
// stream, reusing the buffer is ordered by the stream too). A model's buffers take one
// collective per forward instead of one per buffer. Under a Join each piece is announced.
void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root,
                         size_t piece_bytes, JoinChannel* join = nullptr);

}  // namespace ember::dist::detail

// DistributedWindowSampler: random windows of a text dataset, sharded across ranks.
//
// Each epoch draws total_size() distinct window starts with data::random_window_starts(
// num_windows, total_size(), seed, epoch) (the same draw on every rank), and rank r takes
// positions r, r + world, r + 2 world, ... of it, as DistributedSampler shards its order. So
// the ranks' windows are disjoint, together they are one draw, and with a world of one the
// order is data::RandomWindowSampler's. Where DistributedSampler pads by repeating indices,
// this sampler draws fresh windows: every rank gets ceil(num_samples / world) of them
// (floor with drop_last). The order depends on (seed, epoch, world size, rank) only, never on
// the DataLoader's workers.
//
// It is a DistributedSampler: set_epoch() (select the epoch before each one: passes repeat the
// selected epoch's windows), set_position(), state()/load_state() on another number of ranks
// (the draw is the epoch's global order: a larger draw begins with a smaller one, so a resized
// split continues the same draw) and checkpoints work unchanged.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "distributed_sampler.h"
#include "process_group.h"

namespace ember::dist {

struct WindowSamplerOptions {
  uint64_t seed = 0;
  bool drop_last = false;  // floor(num_samples / world) windows per rank instead of ceil
};

class DistributedWindowSampler : public DistributedSampler {
 public:
  // num_windows: the dataset's size(); num_samples: windows per epoch over all ranks.
  // ember::Error when the ranks together need more windows than there are.
  DistributedWindowSampler(int64_t num_windows, int64_t num_samples, int num_replicas, int rank,
                           WindowSamplerOptions options = {});
  DistributedWindowSampler(int64_t num_windows, int64_t num_samples, const ProcessGroup& group,
                           WindowSamplerOptions options = {});
  // num_replicas and rank from the default group; ember::Error before init_process_group().
  DistributedWindowSampler(int64_t num_windows, int64_t num_samples,
                           WindowSamplerOptions options = {});

  int64_t num_windows() const { return num_windows_; }
  bool shuffles() const override { return true; }
  // DistributedSampler's, and a split that would need more windows than there are.
  std::string refusal(const SamplerState& s) const override;

 protected:
  // The first `length` window starts of the epoch's draw.
  std::vector<int64_t> global_order(int64_t length) const override;
  std::string order_name() const override { return "windows of " + std::to_string(num_windows_); }

 private:
  int64_t num_windows_;
  uint64_t seed_;
};

}  // namespace ember::dist

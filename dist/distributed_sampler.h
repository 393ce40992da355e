// DistributedSampler: each rank's share of a dataset (torch.utils.data.distributed's model).
//
// Each epoch the dataset's indices are shuffled with seed + epoch (the same permutation on
// every rank), padded to a multiple of the world size by repeating indices from the start
// (or, with drop_last, cut to one), and rank r takes positions r, r + world, r + 2 world, ...
// So the shards are disjoint up to the padding and together cover the dataset.
// With pad = false (and drop_last off) nothing is repeated: every index is seen exactly once
// and the first dataset_size % world ranks get one index more than the others, so ranks run
// out of batches at different times (train such uneven shards under dist::Join, join.h).
//
// As in PyTorch, the order is a function of (seed, epoch) and set_epoch(e) selects the epoch:
// every DataLoader pass, whole or partial, loads the epoch selected last, so call
// sampler->set_epoch(epoch) before each epoch. Passes between two set_epoch() calls repeat
// one order (rank 0 warns once per loader when a shuffled epoch is passed over twice).
//
// A run resumed mid-epoch continues where it stopped: set_position(p) makes the next
// indices() of the current epoch start at position p of this rank's shard; the position
// resets to 0 when set_epoch() selects another epoch. Checkpoints save (epoch, position).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ember/data/dataset.h>
#include <ember/data/sampler.h>

#include "process_group.h"

namespace ember::dist {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  // false: no padding, shards of unequal length (see above). drop_last takes precedence.
  bool pad = true;
};

class DistributedSampler : public data::Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                     DistributedSamplerOptions options = {});
  // num_replicas and rank from the group.
  DistributedSampler(int64_t dataset_size, const ProcessGroup& group,
                     DistributedSamplerOptions options = {});
  // num_replicas and rank from the default group, as torch.distributed's
  // DistributedSampler(dataset): ember::Error before init_process_group().
  explicit DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options = {});
  explicit DistributedSampler(const data::Dataset& dataset, DistributedSamplerOptions options = {});
  explicit DistributedSampler(const std::shared_ptr<const data::Dataset>& dataset,
                              DistributedSamplerOptions options = {});

  // This rank's indices for epoch(), from position() on.
  std::vector<int64_t> indices() const override;
  // How many indices() yields: num_samples() - position().
  int64_t size() const override { return num_samples_ - position_; }

  // The length of this rank's full shard, and of the padded (or cut) global order.
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return total_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

  // Where in this rank's shard of the current epoch indices() starts (0..num_samples()).
  int64_t position() const { return position_; }
  void set_position(int64_t position);

  bool shuffles() const override { return options_.shuffle; }
  bool reports_warnings() const override { return rank_ == 0; }

 protected:
  void on_set_epoch(uint64_t previous, uint64_t epoch) override;
  // The default group, for the constructors without one; ember::Error naming `op` and what
  // to do when init_process_group() was not called.
  static std::shared_ptr<ProcessGroup> default_group(const char* op);

 private:
  int64_t dataset_size_;
  int num_replicas_, rank_;
  DistributedSamplerOptions options_;
  int64_t num_samples_, total_size_;
  int64_t position_ = 0;
};

}  // namespace ember::dist

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
// resets to 0 when set_epoch() selects another epoch.
//
// Resuming on another number of ranks: state() gives the position in global terms
// (SamplerState: the epoch, and how many samples of the epoch's global order are consumed),
// which does not depend on the world size. Ranks that all took the same number of samples p
// (equal steps, as DDP's) have consumed a prefix of the global order: positions
// 0 .. p * world - 1. load_state() on any number of ranks W' splits the rest of that epoch's
// order (positions consumed .. dataset_size - 1) among the W' ranks the same way (rank r takes
// consumed + r, consumed + r + W', ...), so every sample of the epoch is read exactly once
// across the resize. The tail of the rest is then treated as a fresh epoch's tail at W': padded
// to a multiple of W' by repeating the epoch's first indices (pad), cut to one (drop_last:
// (dataset_size - consumed) % W' samples are left out, where the run at the saved size would
// have left out dataset_size % W), or split unevenly (pad = false). At the saved world size
// this is exactly the shard the saved run would have read. The next epoch starts from its
// beginning on the new ranks. A state this sampler cannot continue (another dataset size,
// order or seed) is an ember::Error naming why; dist::Checkpoint saves and loads it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
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

// A sampler's position in global terms, independent of the world size (see above).
struct SamplerState {
  uint64_t epoch = 0;
  int64_t consumed = 0;      // samples of the epoch's global order read: positions 0 .. consumed-1
  int64_t dataset_size = 0;  // the epoch's length before padding or cutting
  uint64_t seed = 0;
  std::string order;   // what the global order is: "shuffled", "sequential", "windows of N"
  int world_size = 1;  // of the ranks that took it (said in messages; never needed to continue)

  // As strings (a checkpoint's metadata): epoch, consumed, dataset_size, seed, order,
  // world_size, and position (consumed / world_size, what ember before global states read).
  std::map<std::string, std::string> to_strings() const;
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

  // The length of this rank's full shard (from start()), and where the padded (or cut) global
  // order of the epoch ends.
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return total_size_; }
  // The epoch's length before padding or cutting (a window sampler's: windows per epoch).
  int64_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }

  // Where in this rank's shard of the current epoch indices() starts (0..num_samples()).
  int64_t position() const { return position_; }
  void set_position(int64_t position);

  // The global position after this rank has also consumed `consumed_here` more of its
  // indices(): start() + (position() + consumed_here) * num_replicas(), every rank assumed to
  // be as far (see above).
  SamplerState state(int64_t consumed_here = 0) const;
  // Why this sampler cannot continue `s` (another dataset size, order or seed, a consumed
  // count past the epoch), or "" when it can.
  virtual std::string refusal(const SamplerState& s) const;
  // Continues `s` on this sampler's ranks: selects s.epoch and splits the rest of its order
  // from s.consumed on. ember::Error "DistributedSampler::load_state: <refusal>" when it cannot.
  void load_state(const SamplerState& s);
  // The state that to_strings() wrote, each key after `prefix` in `strings` (a checkpoint's
  // metadata: "sampler."), values parsed and checked (ember::Error naming a key that is
  // missing or not a number). Strings from ember before global states hold only epoch and
  // position: they are read as this sampler's order at this world size, consumed = position *
  // num_replicas(). Not checked against this sampler: see refusal().
  SamplerState state_from_strings(const std::map<std::string, std::string>& strings,
                                  const std::string& prefix = "") const;
  // Where in the epoch's global order this rank's split begins: 0, or the consumed count of
  // the state last loaded for this epoch when it does not divide among the ranks (when it
  // does, the split begins at 0 and position() is consumed / num_replicas(), as a resume on
  // the saving world size has it).
  int64_t start() const { return start_; }

  bool shuffles() const override { return options_.shuffle; }
  bool reports_warnings() const override { return rank_ == 0; }

 protected:
  void on_set_epoch(uint64_t previous, uint64_t epoch) override;
  // The epoch's global order up to `length` positions (length >= dataset size: padded by
  // repeating from the start; less: cut). Subclasses that draw another order override it and
  // order_name().
  virtual std::vector<int64_t> global_order(int64_t length) const;
  virtual std::string order_name() const { return options_.shuffle ? "shuffled" : "sequential"; }
  // This rank's shard length and the order's end for a split from global position `start`.
  struct Split {
    int64_t num_samples, total_size;
  };
  Split split_from(int64_t start) const;
  // The default group, for the constructors without one; ember::Error naming `op` and what
  // to do when init_process_group() was not called.
  static std::shared_ptr<ProcessGroup> default_group(const char* op);

 private:
  int64_t dataset_size_;
  int num_replicas_, rank_;
  DistributedSamplerOptions options_;
  void split();  // num_samples_ and total_size_ from split_from(start_)

  int64_t num_samples_ = 0, total_size_ = 0;
  int64_t start_ = 0;
  int64_t position_ = 0;
};

}  // namespace ember::dist

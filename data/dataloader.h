// DataLoader: batches of a Dataset, loaded ahead of the training loop by worker threads.
//
//   DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .seed = 1,
//                               .num_workers = 2, .transform = augment});
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     loader.set_epoch(epoch);  // or, with a sampler, sampler->set_epoch(epoch) as in PyTorch
//     for (const Batch& batch : loader) step(batch.data, batch.target);
//   }
//
// Which epoch a pass loads is the sampler's rule (sampler.h), set_epoch() on either the
// sampler or the loader selecting it. A given sampler whose epoch the user sets
// (dist::DistributedSampler and the like) loads the selected epoch on every pass, whole or
// partial, as in PyTorch: sampler->set_epoch(e), a peek at one batch, then a loop: the loop
// is epoch e. Two complete passes of one shuffled epoch with no set_epoch() between repeat
// its order, and the loader warns once on stderr (rank 0 only for DistributedSampler).
// Without a sampler (shuffle = true: a RandomSampler of `seed`; false: a SequentialSampler),
// and with a given RandomSampler or SequentialSampler, each pass draws a new order: the first
// pass after set_epoch(e) is epoch e, the next e + 1, and so on, as PyTorch's RandomSampler.
// `shuffle = true` together with a sampler is an ember::Error, as PyTorch's ValueError.
//
// Batch k of an epoch holds the samples at positions [k*B, (k+1)*B) of the sampler's order
// for that epoch, each transformed with a SampleRng of (seed, epoch, dataset index). A batch
// is therefore a pure function of the options and the epoch: the sequence is the same for
// any num_workers, and batches reach the caller in order. Workers each build whole batches,
// straight into one contiguous tensor per field (pinned when asked and CUDA is present);
// a pageable batch buffer is reused once the caller holds no tensor viewing it.
//
// An exception while loading a sample reaches the caller, in batch order, as an
// ember::Error naming the sample index; the epoch then ends. Destroying the loader (or
// starting another epoch) mid-epoch stops and joins the workers.
#pragma once

#include <atomic>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include <ember/tensor/tensor.h>

#include "dataset.h"
#include "sampler.h"
#include "transforms.h"

namespace ember::data {

struct Batch {
  Tensor data;                   // [B, ...]: the samples stacked, in their dtype
  Tensor target;                 // [B] i64 class indices, or the examples' target_tensor stacked
  std::vector<int64_t> indices;  // the dataset index of each sample
};

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;  // a RandomSampler of `seed`; ember::Error together with `sampler`
  // For shuffling and for the transforms' randomness. Unset: drawn from the default generator
  // when the loader is made, as PyTorch's loader draws its base seed, so manual_seed() before
  // makes the run repeatable and unseeded processes shuffle and augment differently.
  std::optional<uint64_t> seed{};
  bool drop_last = false;   // drop a final batch smaller than batch_size
  int num_workers = 0;      // 0: load in the calling thread, on demand
  int prefetch_factor = 2;  // batches each worker may have loaded ahead of the caller
  bool pin_memory = false;  // page-locked batches for non_blocking copies (when CUDA is present)
  std::shared_ptr<Sampler> sampler = nullptr;            // the order; its epoch is the loader's
  std::shared_ptr<const Transform> transform = nullptr;  // applied to each example's data
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch (for progress bars).
  int64_t size() const;
  // Selects the epoch the next begin() loads: sampler->set_epoch(epoch) (the given sampler,
  // or the loader's own RandomSampler / SequentialSampler).
  void set_epoch(uint64_t epoch);
  // The epoch the next begin() loads, unless set_epoch() selects another.
  uint64_t epoch() const;
  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }
  // The seed in use: options().seed, or the one drawn for it.
  uint64_t seed() const { return seed_; }

  class Iterator;
  // Starts loading epoch epoch() (ending any epoch still in flight, whose iterators become
  // invalid) and returns an iterator at its first batch.
  Iterator begin();
  std::default_sentinel_t end() const { return {}; }

 private:
  struct Run;
  int64_t batches_for(int64_t samples) const;
  // Batch `batch` of an epoch whose sampler order is `order`; returns early (incomplete)
  // once `stop` is set.
  Batch load_batch(uint64_t epoch, const std::vector<int64_t>& order, int64_t batch,
                   const std::atomic<bool>* stop) const;

  struct BufferPool;
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  uint64_t seed_;
  // options_.sampler, or a RandomSampler (shuffle) or SequentialSampler of the dataset.
  std::shared_ptr<Sampler> sampler_;
  // The sampler's epoch_selections() when the last complete pass started: equal at a later
  // pass of a shuffling sampler means it repeats that order, and the loader warns (once).
  std::optional<uint64_t> whole_pass_selection_;
  bool warned_repeat_ = false;
  std::unique_ptr<BufferPool> pool_;  // declared before run_: the workers use it
  std::unique_ptr<Run> run_;
};

class DataLoader::Iterator {
 public:
  using value_type = Batch;
  using difference_type = std::ptrdiff_t;

  Iterator() = default;
  const Batch& operator*() const { return batch_; }
  const Batch* operator->() const { return &batch_; }
  Iterator& operator++();
  void operator++(int) { ++*this; }
  friend bool operator==(const Iterator& it, std::default_sentinel_t) { return it.run_ == nullptr; }

 private:
  friend class DataLoader;
  explicit Iterator(Run* run);
  Run* run_ = nullptr;
  Batch batch_;
};

}  // namespace ember::data

// DataLoader: batches of a Dataset, loaded ahead of the training loop by worker threads.
//
//   DataLoader loader(dataset, {.batch_size = 128, .shuffle = true, .seed = 1,
//                               .num_workers = 2, .transform = augment});
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     loader.set_epoch(epoch);  // or, with a sampler, sampler->set_epoch(epoch) as in PyTorch
//     for (const Batch& batch : loader) step(batch.data, batch.target);
//   }
//
// Which epoch a pass loads: with a sampler, the sampler's epoch (set_epoch() on either the
// sampler or the loader selects it; a pass not preceded by one moves the sampler on to the
// epoch after the last pass). Without one, the loader's own counter, which set_epoch() sets
// and each pass advances.
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
  bool shuffle = false;     // a RandomSampler of `seed` (ignored when `sampler` is set)
  uint64_t seed = 0;        // for shuffling and for the transforms' randomness
  bool drop_last = false;   // drop a final batch smaller than batch_size
  int num_workers = 0;      // 0: load in the calling thread, on demand
  int prefetch_factor = 2;  // batches each worker may have loaded ahead of the caller
  bool pin_memory = false;  // page-locked batches for non_blocking copies (when CUDA is present)
  std::shared_ptr<Sampler> sampler = nullptr;  // overrides shuffle; its epoch is the loader's
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
  // Selects the epoch the next begin() loads (with a sampler: sampler->set_epoch(epoch)).
  void set_epoch(uint64_t epoch);
  // The epoch the next begin() loads, unless set_epoch() selects another.
  uint64_t epoch() const;
  const Dataset& dataset() const { return *dataset_; }
  const DataLoaderOptions& options() const { return options_; }

  class Iterator;
  // Starts loading epoch epoch() (ending any epoch still in flight, whose iterators become
  // invalid) and returns an iterator at its first batch.
  Iterator begin();
  std::default_sentinel_t end() const { return {}; }

 private:
  struct Run;
  int64_t batches_for(int64_t samples) const;
  // True when the sampler's epoch was not selected since the last pass.
  bool sampler_moves_on() const;
  // Batch `batch` of an epoch whose sampler order is `order`; returns early (incomplete)
  // once `stop` is set.
  Batch load_batch(uint64_t epoch, const std::vector<int64_t>& order, int64_t batch,
                   const std::atomic<bool>* stop) const;

  struct BufferPool;
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  uint64_t epoch_ = 0;  // without a sampler
  // The sampler's epoch_selections() right after the last pass chose its epoch; equal at
  // the next begin() means nobody selected an epoch since, and the sampler moves on.
  std::optional<uint64_t> sampler_selections_seen_;
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

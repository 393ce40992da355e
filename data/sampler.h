// Samplers decide which dataset indices an epoch visits, and in what order.
//
// A sampler's order is a pure function of its settings and the epoch, so every process and
// every worker count sees the same sequence. As in PyTorch, the sampler's epoch is the one
// the DataLoader loads: `sampler->set_epoch(e)` before iterating selects epoch e (a resumed
// run in a fresh loader included). A loader whose sampler was not given an epoch since its
// last pass moves the sampler on to the next epoch itself, so forgetting set_epoch() does not
// repeat one shuffle every epoch. The distributed sampler (dist/) implements the same
// interface.
#pragma once

#include <cstdint>
#include <vector>

namespace ember::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The dataset indices of epoch epoch(), in the order they are to be loaded.
  virtual std::vector<int64_t> indices() const = 0;
  // How many indices one epoch yields.
  virtual int64_t size() const = 0;
  // Selects the epoch whose order indices() returns; shuffling samplers reseed from it.
  // Not virtual, so the DataLoader always sees the selection; samplers that react to a new
  // epoch override on_set_epoch().
  void set_epoch(uint64_t epoch) {
    const uint64_t previous = epoch_;
    epoch_ = epoch;
    ++epoch_selections_;
    on_set_epoch(previous, epoch);
  }
  uint64_t epoch() const { return epoch_; }
  // How many times set_epoch() has been called: the DataLoader tells from it whether the
  // epoch was chosen since its last pass.
  uint64_t epoch_selections() const { return epoch_selections_; }

 protected:
  // Called by set_epoch() after the epoch changed from `previous` to `epoch` (or was
  // selected again, when they are equal).
  virtual void on_set_epoch(uint64_t /*previous*/, uint64_t /*epoch*/) {}

 private:
  uint64_t epoch_ = 0;
  uint64_t epoch_selections_ = 0;
};

// 0, 1, ..., size - 1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t size);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return size_; }

 private:
  int64_t size_;
};

// A fresh permutation of 0..size-1 each epoch, determined by (seed, epoch).
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t size, uint64_t seed = 0);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return size_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t size_;
  uint64_t seed_;
};

// The permutation of 0..n-1 that RandomSampler yields for (seed, epoch): a Fisher-Yates
// shuffle driven by Philox, identical on every platform and standard library.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, uint64_t epoch);

// --- random windows (language-model training) ---------------------------------------------------

// `count` distinct window starts drawn from [0, num_windows), in random order, determined by
// (seed, epoch): a partial Fisher-Yates shuffle driven by Philox, so the first k starts of a
// larger count are the k starts of a smaller one. ember::Error when count > num_windows.
std::vector<int64_t> random_window_starts(int64_t num_windows, int64_t count, uint64_t seed,
                                          uint64_t epoch);

// num_samples random windows of a text dataset per epoch (nanoGPT's get_batch draws, made
// reproducible): random_window_starts(num_windows, num_samples, seed, epoch()). An epoch is
// then as long as the caller wants, not a pass over every window, and no window repeats
// within it. dist::DistributedWindowSampler shards the same draws across ranks.
class RandomWindowSampler : public Sampler {
 public:
  // num_windows: the dataset's size() (TextDataset: tokens - block_size).
  RandomWindowSampler(int64_t num_windows, int64_t num_samples, uint64_t seed = 0);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return num_samples_; }
  int64_t num_windows() const { return num_windows_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t num_windows_;
  int64_t num_samples_;
  uint64_t seed_;
};

}  // namespace ember::data

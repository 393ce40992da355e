// Samplers decide which dataset indices an epoch visits, and in what order.
//
// A sampler's order is a pure function of its settings and the epoch, so every process and
// every worker count sees the same sequence. Which epoch each DataLoader pass loads follows
// PyTorch, sampler by sampler:
//  - A sampler whose epoch the user sets (dist::DistributedSampler, dist::DistributedWindowSampler,
//    RandomWindowSampler, and any sampler not overriding moves_on_each_pass()): every pass,
//    whole or partial, loads epoch(), the one the last set_epoch() selected (0 before any).
//    Passes between two set_epoch() calls repeat its order, as in PyTorch, so
//    `sampler->set_epoch(e)`, a peek at one batch, then a loop: the loop gets epoch e. Call
//    set_epoch(epoch) before each epoch; a resumed run calls it in its fresh loader. Where a
//    shuffled order starts a pass again after a complete pass of it with no set_epoch() in
//    between, the DataLoader warns once (on stderr, on one process: the sampler's
//    reports_warnings()), and still loads the same order.
//  - RandomSampler and SequentialSampler, which have no set_epoch in PyTorch and draw a new
//    order (and new random transforms) on every iteration: the first pass after set_epoch(e)
//    (or after construction, e = 0) loads epoch e, each further pass moves on by one epoch.
//    So a peek after set_epoch(e) is epoch e and the loop that follows is epoch e + 1, as in
//    PyTorch; a loop preceded by set_epoch(e) is epoch e.
// The distributed samplers (dist/) implement the same interface.
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
  // Selects the epoch whose order indices() returns (and the next pass loads); shuffling
  // samplers reseed from it. Not virtual, so the DataLoader always sees the selection;
  // samplers that react to a new epoch override on_set_epoch().
  void set_epoch(uint64_t epoch) {
    const uint64_t previous = epoch_;
    epoch_ = epoch;
    ++epoch_selections_;
    passed_ = false;
    on_set_epoch(previous, epoch);
  }
  uint64_t epoch() const { return epoch_; }
  // How many times set_epoch() has been called: the DataLoader tells from it whether the
  // epoch was selected again since a pass.
  uint64_t epoch_selections() const { return epoch_selections_; }

  // false (the default): every pass loads epoch() until set_epoch() selects another. true:
  // each pass after the first since set_epoch() moves on to the next epoch (see above).
  virtual bool moves_on_each_pass() const { return false; }
  // Whether indices() depends on the epoch (a shuffle): the DataLoader warns when such an
  // order is loaded again after a complete pass without set_epoch() in between. Override it
  // in a sampler of your own that shuffles.
  virtual bool shuffles() const { return false; }
  // Whether this process prints the sampler's warnings (dist::DistributedSampler: rank 0).
  virtual bool reports_warnings() const { return true; }

  // The epoch the next start_pass() loads.
  uint64_t next_pass_epoch() const { return epoch_ + (moves_on_each_pass() && passed_ ? 1 : 0); }
  // Starts a pass (the DataLoader calls it as each pass begins): moves on to
  // next_pass_epoch() and returns its order, indices().
  std::vector<int64_t> start_pass() {
    if (next_pass_epoch() != epoch_) set_epoch(next_pass_epoch());
    passed_ = true;
    return indices();
  }

 protected:
  // Called by set_epoch() after the epoch changed from `previous` to `epoch` (or was
  // selected again, when they are equal).
  virtual void on_set_epoch(uint64_t /*previous*/, uint64_t /*epoch*/) {}

 private:
  uint64_t epoch_ = 0;
  uint64_t epoch_selections_ = 0;
  bool passed_ = false;  // a pass started since the last set_epoch()
};

// 0, 1, ..., size - 1 every epoch. Each pass moves on to a new epoch (for the transforms'
// randomness), as PyTorch's loader draws new random transforms on each iteration.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t size);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return size_; }
  bool moves_on_each_pass() const override { return true; }

 private:
  int64_t size_;
};

// A fresh permutation of 0..size-1 each epoch, determined by (seed, epoch). As PyTorch's
// RandomSampler, each pass draws a new order: it moves on one epoch per pass after the first
// since set_epoch() (the DataLoader's shuffle = true is this sampler).
class RandomSampler : public Sampler {
 public:
  explicit RandomSampler(int64_t size, uint64_t seed = 0);
  std::vector<int64_t> indices() const override;
  int64_t size() const override { return size_; }
  bool moves_on_each_pass() const override { return true; }
  bool shuffles() const override { return true; }
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
  bool shuffles() const override { return true; }
  int64_t num_windows() const { return num_windows_; }
  uint64_t seed() const { return seed_; }

 private:
  int64_t num_windows_;
  int64_t num_samples_;
  uint64_t seed_;
};

}  // namespace ember::data

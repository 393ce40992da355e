// Samplers decide which dataset indices an epoch visits, and in what order.
//
// A sampler's order is a pure function of its settings and the epoch, so every process and
// every worker count sees the same sequence; the DataLoader calls set_epoch() before each
// epoch. The distributed sampler (dist/) implements the same interface.
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
  virtual void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }

 private:
  uint64_t epoch_ = 0;
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

}  // namespace ember::data

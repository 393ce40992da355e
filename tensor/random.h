// Reproducible random numbers from a counter-based Philox4x32-10 generator.
//
// Element i of a draw is a pure function of (seed, offset, i), so the CPU and CUDA kernels
// produce the same numbers for the same seed, whatever the threading or launch shape.
// Each draw advances the generator's offset by one.
#pragma once

#include <cstdint>
#include <mutex>

#include "tensor.h"

namespace ember {

// A generator built without a seed starts from seed 0, so it is deterministic (as a
// torch.Generator() is); only the default generator starts from a fresh seed.
class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}

  void manual_seed(uint64_t seed);
  // The seed it was built with or last given (torch.Generator.initial_seed(); unlike
  // torch.Generator.seed() it does not reseed).
  uint64_t seed() const;
  // The draw counter; with seed() it is the whole state (saved in checkpoints).
  uint64_t offset() const;
  void set_state(uint64_t seed, uint64_t offset);
  // Reserves the next draw: returns (seed, offset) to generate it from.
  std::pair<uint64_t, uint64_t> next_draw();

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

// The process-wide generator that draws use when none is given (weight initialisation,
// dropout, ...). As PyTorch's, it starts from a fresh nondeterministic 64-bit seed in each
// process, so the ranks of a job draw different numbers unless seeded; manual_seed makes a
// run repeatable.
Generator& default_generator();
// Seeds the default generator (torch.manual_seed).
void manual_seed(uint64_t seed);
// The default generator's seed: the fresh one it started from, or the last manual_seed
// (torch.initial_seed). manual_seed(initial_seed()) replays the process's draws from the start.
uint64_t initial_seed();

// Uniform in [low, high).
Tensor rand(const Shape& sizes, TensorOptions options = {}, Generator* gen = nullptr);
Tensor uniform(const Shape& sizes, double low, double high, TensorOptions options = {},
               Generator* gen = nullptr);
// Normal with the given mean and standard deviation (0 and 1 for randn).
Tensor randn(const Shape& sizes, TensorOptions options = {}, Generator* gen = nullptr);
Tensor normal(const Shape& sizes, double mean, double stddev, TensorOptions options = {},
              Generator* gen = nullptr);
// Integers uniform in [low, high); dtype i64 unless options say otherwise.
Tensor randint(int64_t low, int64_t high, const Shape& sizes, TensorOptions options = kI64,
               Generator* gen = nullptr);
// 1 with probability p[i], else 0, in p's dtype and shape.
Tensor bernoulli(const Tensor& p, Generator* gen = nullptr);
// 1 with probability p, else 0.
Tensor bernoulli(const Shape& sizes, double p, TensorOptions options = {},
                 Generator* gen = nullptr);
// In-place fills.
Tensor& uniform_(Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0.0, double stddev = 1.0, Generator* gen = nullptr);
// A random permutation of 0..n-1 (i64), as torch.randperm.
Tensor randperm(int64_t n, Generator* gen = nullptr);

}  // namespace ember

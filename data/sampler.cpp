#include "sampler.h"

#include <numeric>
#include <utility>

#include <ember/tensor/detail/philox.h>
#include <ember/tensor/error.h>

#include "detail/random.h"

namespace ember::data {

SequentialSampler::SequentialSampler(int64_t size) : size_(size) {
  EMBER_CHECK(size >= 0, "SequentialSampler", "size must be >= 0, got ", size);
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> result(static_cast<size_t>(size_));
  std::iota(result.begin(), result.end(), int64_t{0});
  return result;
}

RandomSampler::RandomSampler(int64_t size, uint64_t seed) : size_(size), seed_(seed) {
  EMBER_CHECK(size >= 0, "RandomSampler", "size must be >= 0, got ", size);
}

std::vector<int64_t> RandomSampler::indices() const {
  return random_permutation(size_, seed_, epoch());
}

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, uint64_t epoch) {
  EMBER_CHECK(n >= 0, "random_permutation", "n must be >= 0, got ", n);
  std::vector<int64_t> result(static_cast<size_t>(n));
  std::iota(result.begin(), result.end(), int64_t{0});
  const uint64_t key = detail::mix64(seed ^ detail::kSamplerSalt);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = ember::detail::random_int(key, epoch, static_cast<uint64_t>(i), 0,
                                                static_cast<uint64_t>(i) + 1);
    std::swap(result[static_cast<size_t>(i)], result[static_cast<size_t>(j)]);
  }
  return result;
}

}  // namespace ember::data

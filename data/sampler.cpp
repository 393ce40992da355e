#include "sampler.h"

#include <numeric>
#include <unordered_map>
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

std::vector<int64_t> random_window_starts(int64_t num_windows, int64_t count, uint64_t seed,
                                          uint64_t epoch) {
  EMBER_CHECK(num_windows >= 0 && count >= 0, "random_window_starts",
              "num_windows and count must be >= 0, got ", num_windows, " and ", count);
  EMBER_CHECK(count <= num_windows, "random_window_starts", "cannot draw ", count,
              " distinct windows from ", num_windows);
  const uint64_t key = detail::mix64(seed ^ detail::kWindowSalt);
  // Step i swaps position i with a random position in [i, n) of 0..n-1: a dense array when
  // the draw takes a good part of it, else only the moved positions in a map. The draws are
  // the same either way.
  std::vector<int64_t> result(static_cast<size_t>(count));
  const auto draw = [&](int64_t i) {
    return i + ember::detail::random_int(key, epoch, static_cast<uint64_t>(i), 0,
                                         static_cast<uint64_t>(num_windows - i));
  };
  if (count * 8 >= num_windows) {
    std::vector<int64_t> order(static_cast<size_t>(num_windows));
    std::iota(order.begin(), order.end(), int64_t{0});
    for (int64_t i = 0; i < count; ++i) {
      std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(draw(i))]);
      result[static_cast<size_t>(i)] = order[static_cast<size_t>(i)];
    }
    return result;
  }
  std::unordered_map<int64_t, int64_t> moved;  // position -> value, where not the identity
  const auto at = [&](int64_t p) {
    const auto it = moved.find(p);
    return it == moved.end() ? p : it->second;
  };
  for (int64_t i = 0; i < count; ++i) {
    const int64_t j = draw(i);
    const int64_t value_j = at(j);
    moved[j] = at(i);
    result[static_cast<size_t>(i)] = value_j;
  }
  return result;
}

RandomWindowSampler::RandomWindowSampler(int64_t num_windows, int64_t num_samples, uint64_t seed)
    : num_windows_(num_windows), num_samples_(num_samples), seed_(seed) {
  EMBER_CHECK(num_samples >= 0 && num_samples <= num_windows, "RandomWindowSampler", "num_samples ",
              num_samples, " is outside [0, ", num_windows,
              "]: an epoch draws distinct windows of the ", num_windows, " there are");
}

std::vector<int64_t> RandomWindowSampler::indices() const {
  return random_window_starts(num_windows_, num_samples_, seed_, epoch());
}

}  // namespace ember::data

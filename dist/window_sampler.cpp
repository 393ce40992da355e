#include "window_sampler.h"

#include <ember/tensor/error.h>

namespace ember::dist {

DistributedWindowSampler::DistributedWindowSampler(int64_t num_windows, int64_t num_samples,
                                                   int num_replicas, int rank,
                                                   WindowSamplerOptions options)
    : DistributedSampler(num_samples, num_replicas, rank,
                         {.shuffle = false, .seed = options.seed, .drop_last = options.drop_last}),
      num_windows_(num_windows),
      seed_(options.seed) {
  EMBER_CHECK(total_size() <= num_windows, "DistributedWindowSampler", num_replicas, " ranks of ",
              this->num_samples(), " windows need ", total_size(),
              " distinct windows, but the dataset has ", num_windows);
}

DistributedWindowSampler::DistributedWindowSampler(int64_t num_windows, int64_t num_samples,
                                                   const ProcessGroup& group,
                                                   WindowSamplerOptions options)
    : DistributedWindowSampler(num_windows, num_samples, group.size(), group.rank(), options) {}

DistributedWindowSampler::DistributedWindowSampler(int64_t num_windows, int64_t num_samples,
                                                   WindowSamplerOptions options)
    : DistributedWindowSampler(num_windows, num_samples, *default_group("DistributedWindowSampler"),
                               options) {}

std::vector<int64_t> DistributedWindowSampler::indices() const {
  const std::vector<int64_t> starts =
      data::random_window_starts(num_windows_, total_size(), seed_, epoch());
  std::vector<int64_t> shard;
  for (int64_t k = position(); k < num_samples(); ++k)
    shard.push_back(starts[static_cast<size_t>(rank() + k * num_replicas())]);
  return shard;
}

}  // namespace ember::dist

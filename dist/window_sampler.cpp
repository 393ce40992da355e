#include "window_sampler.h"

#include <algorithm>

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

std::vector<int64_t> DistributedWindowSampler::global_order(int64_t length) const {
  return data::random_window_starts(num_windows_, length, seed_, epoch());
}

std::string DistributedWindowSampler::refusal(const SamplerState& s) const {
  std::string why = DistributedSampler::refusal(s);
  if (!why.empty()) return why;
  const int64_t total = split_from(std::min(s.consumed, dataset_size())).total_size;
  if (total > num_windows_)
    return ember::detail::str_cat("continued on ", num_replicas(), " ranks the epoch needs ", total,
                                  " distinct windows, but the dataset has ", num_windows_);
  return "";
}

}  // namespace ember::dist

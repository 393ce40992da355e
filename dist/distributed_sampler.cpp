#include "distributed_sampler.h"

#include <numeric>

#include <ember/tensor/error.h>

#include "init.h"

namespace ember::dist {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size), num_replicas_(num_replicas), rank_(rank), options_(options) {
  EMBER_CHECK(dataset_size >= 0, "DistributedSampler", "dataset size must be >= 0, got ",
              dataset_size);
  EMBER_CHECK(num_replicas > 0, "DistributedSampler", "num_replicas must be positive, got ",
              num_replicas);
  EMBER_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler", "rank ", rank,
              " is outside [0, ", num_replicas, ")");
  const int64_t world = num_replicas;
  if (options.drop_last && dataset_size % world != 0) {
    num_samples_ = dataset_size / world;  // drop the tail so every rank gets the same count
    total_size_ = num_samples_ * world;
  } else if (!options.pad && !options.drop_last) {
    // Positions rank, rank + world, ... below dataset_size: no index is repeated.
    num_samples_ = dataset_size / world + (rank < dataset_size % world ? 1 : 0);
    total_size_ = dataset_size;
  } else {
    num_samples_ = (dataset_size + world - 1) / world;
    total_size_ = num_samples_ * world;
  }
}

DistributedSampler::DistributedSampler(int64_t dataset_size, const ProcessGroup& group,
                                       DistributedSamplerOptions options)
    : DistributedSampler(dataset_size, group.size(), group.rank(), options) {}

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : DistributedSampler(dataset_size, *default_group("DistributedSampler"), options) {}

DistributedSampler::DistributedSampler(const data::Dataset& dataset,
                                       DistributedSamplerOptions options)
    : DistributedSampler(dataset.size(), options) {}

DistributedSampler::DistributedSampler(const std::shared_ptr<const data::Dataset>& dataset,
                                       DistributedSamplerOptions options)
    : DistributedSampler(
          [&]() -> const data::Dataset& {
            EMBER_CHECK(dataset != nullptr, "DistributedSampler", "dataset is null");
            return *dataset;
          }(),
          options) {}

std::shared_ptr<ProcessGroup> DistributedSampler::default_group(const char* op) {
  EMBER_CHECK(is_initialized(), op,
              "no group given and the default process group is not initialized: call "
              "dist::init_process_group() first, or pass num_replicas and rank (or a group)");
  return get_default_group();
}

void DistributedSampler::on_set_epoch(uint64_t previous, uint64_t epoch) {
  if (epoch != previous) position_ = 0;
}

void DistributedSampler::set_position(int64_t position) {
  EMBER_CHECK(position >= 0 && position <= num_samples_, "DistributedSampler::set_position",
              "position ", position, " is outside [0, ", num_samples_, "]");
  position_ = position;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = data::random_permutation(dataset_size_, options_.seed + epoch(), 0);
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const auto total = static_cast<size_t>(total_size());
  if (order.size() > total) {
    order.resize(total);
  } else {
    // Pad by repeating from the start (several times over when the dataset is tiny).
    const size_t n = order.size();
    for (size_t i = 0; order.size() < total && n > 0; ++i) order.push_back(order[i % n]);
  }
  std::vector<int64_t> shard;
  for (size_t i = static_cast<size_t>(rank_ + position_ * num_replicas_); i < order.size();
       i += static_cast<size_t>(num_replicas_))
    shard.push_back(order[i]);
  return shard;
}

}  // namespace ember::dist

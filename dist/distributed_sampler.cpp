#include "distributed_sampler.h"

#include <algorithm>
#include <charconv>
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
  split();
}

DistributedSampler::Split DistributedSampler::split_from(int64_t start) const {
  const int64_t world = num_replicas_, rest = dataset_size_ - start;
  if (options_.drop_last && rest % world != 0) {
    const int64_t each = rest / world;  // drop the tail so every rank gets the same count
    return {each, start + each * world};
  }
  if (!options_.pad && !options_.drop_last) {
    // Positions start + rank, start + rank + world, ... below dataset_size: no repeats.
    return {rest / world + (rank_ < rest % world ? 1 : 0), dataset_size_};
  }
  const int64_t each = (rest + world - 1) / world;
  return {each, start + each * world};
}

void DistributedSampler::split() {
  const Split s = split_from(start_);
  num_samples_ = s.num_samples;
  total_size_ = s.total_size;
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
  if (epoch == previous) return;
  position_ = 0;
  if (start_ != 0) {
    start_ = 0;  // another epoch is read from its beginning
    split();
  }
}

void DistributedSampler::set_position(int64_t position) {
  EMBER_CHECK(position >= 0 && position <= num_samples_, "DistributedSampler::set_position",
              "position ", position, " is outside [0, ", num_samples_, "]");
  position_ = position;
}

std::vector<int64_t> DistributedSampler::global_order(int64_t length) const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = data::random_permutation(dataset_size_, options_.seed + epoch(), 0);
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const auto total = static_cast<size_t>(length);
  if (order.size() > total) {
    order.resize(total);
  } else {
    // Pad by repeating from the start (several times over when the dataset is tiny).
    const size_t n = order.size();
    for (size_t i = 0; order.size() < total && n > 0; ++i) order.push_back(order[i % n]);
  }
  return order;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const std::vector<int64_t> order = global_order(total_size_);
  std::vector<int64_t> shard;
  for (auto i = static_cast<size_t>(start_ + rank_ + position_ * num_replicas_); i < order.size();
       i += static_cast<size_t>(num_replicas_))
    shard.push_back(order[i]);
  return shard;
}

std::map<std::string, std::string> SamplerState::to_strings() const {
  return {{"epoch", std::to_string(epoch)},
          {"consumed", std::to_string(consumed)},
          {"dataset_size", std::to_string(dataset_size)},
          {"seed", std::to_string(seed)},
          {"order", order},
          {"world_size", std::to_string(world_size)},
          {"position", std::to_string(world_size > 0 ? consumed / world_size : 0)}};
}

SamplerState DistributedSampler::state(int64_t consumed_here) const {
  EMBER_CHECK(consumed_here >= 0 && consumed_here <= size(), "DistributedSampler::state",
              "consumed ", consumed_here, " is outside [0, ", size(),
              "] (the sampler's remaining indices)");
  SamplerState s;
  s.epoch = epoch();
  s.consumed = std::min(start_ + (position_ + consumed_here) * num_replicas_, total_size_);
  s.dataset_size = dataset_size_;
  s.seed = options_.seed;
  s.order = order_name();
  s.world_size = num_replicas_;
  return s;
}

std::string DistributedSampler::refusal(const SamplerState& s) const {
  using ember::detail::str_cat;
  if (s.dataset_size != dataset_size_)
    return str_cat("the state is of an epoch of ", s.dataset_size,
                   " samples and this sampler's epoch has ", dataset_size_,
                   " (another dataset, or another number of samples per epoch)");
  if (s.order != order_name())
    return str_cat("the state's order is ", s.order, " and this sampler's is ", order_name());
  if (s.order != "sequential" && s.seed != options_.seed)
    return str_cat("the state's order was drawn with seed ", s.seed, " and this sampler's with ",
                   options_.seed);
  // A padded epoch's last row may run past the dataset by less than one world.
  if (s.consumed < 0 || s.consumed > dataset_size_ + std::max(s.world_size, 1))
    return str_cat("the state has consumed ", s.consumed, " samples of an epoch of ",
                   dataset_size_);
  return "";
}

void DistributedSampler::load_state(const SamplerState& s) {
  const std::string why = refusal(s);
  EMBER_CHECK(why.empty(), "DistributedSampler::load_state", why);
  set_epoch(s.epoch);
  const int64_t consumed = std::min(s.consumed, dataset_size_);
  // A count that divides among the ranks is a position in the shards from the epoch's start
  // (the same indices as a split from `consumed`).
  const bool whole_rows = consumed % num_replicas_ == 0;
  start_ = whole_rows ? 0 : consumed;
  split();
  position_ = whole_rows ? consumed / num_replicas_ : 0;
}

SamplerState DistributedSampler::state_from_strings(
    const std::map<std::string, std::string>& strings, const std::string& prefix) const {
  auto text = [&](const char* key) -> const std::string* {
    const auto it = strings.find(prefix + key);
    return it == strings.end() ? nullptr : &it->second;
  };
  auto number = [&](const char* key) -> int64_t {
    const std::string* t = text(key);
    EMBER_CHECK(t != nullptr, "DistributedSampler", "the sampler state has no \"", key, "\"");
    int64_t v = 0;
    const auto [end, error] = std::from_chars(t->data(), t->data() + t->size(), v);
    EMBER_CHECK(error == std::errc() && end == t->data() + t->size() && v >= 0,
                "DistributedSampler", "the sampler state's \"", key, "\" = \"", *t,
                "\" is not a count");
    return v;
  };
  SamplerState s;
  s.epoch = static_cast<uint64_t>(number("epoch"));
  if (text("consumed") == nullptr) {  // ember before global states: this world's position
    // Such a file continues only on the world it was taken on, which "rng_ranks" (the ranks
    // whose random states it holds) names where the file has it.
    const auto ranks = strings.find("rng_ranks");
    EMBER_CHECK(ranks == strings.end() || ranks->second == std::to_string(num_replicas_),
                "DistributedSampler", "the snapshot was taken on ", ranks->second,
                " rank(s) by an ember that kept each rank's own position, and this run has ",
                num_replicas_, ": resume it on ", ranks->second, " rank(s)");
    const int64_t position = number("position");
    EMBER_CHECK(position <= dataset_size_, "DistributedSampler", "the sampler state's position ",
                position, " is past the data set's ", dataset_size_, " samples");
    s.consumed = position * num_replicas_;
    s.dataset_size = dataset_size_;
    s.seed = options_.seed;
    s.order = order_name();
    s.world_size = num_replicas_;
    return s;
  }
  s.consumed = number("consumed");
  s.dataset_size = number("dataset_size");
  s.world_size = static_cast<int>(std::min<int64_t>(number("world_size"), 1 << 30));
  const std::string* order = text("order");
  EMBER_CHECK(order != nullptr, "DistributedSampler", "the sampler state has no \"order\"");
  s.order = *order;
  const std::string seed = text("seed") != nullptr ? *text("seed") : std::string();
  const auto [end, error] = std::from_chars(seed.data(), seed.data() + seed.size(), s.seed);
  EMBER_CHECK(!seed.empty() && error == std::errc() && end == seed.data() + seed.size(),
              "DistributedSampler", "the sampler state's \"seed\" = \"", seed,
              "\" is not a 64-bit seed");
  return s;
}

}  // namespace ember::dist

#include "checkpoint.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <vector>

#include <nlohmann/json.hpp>

#include <ember/dist/flight_recorder.h>

#include "detail/default_group.h"
#include "detail/safetensors.h"
#include "init.h"

namespace ember::dist {

namespace {

constexpr const char* kFormat = "ember.checkpoint.v1";

template <typename... Parts>
Error load_error(const std::string& path, const Parts&... parts) {
  return detail::file_error("load_checkpoint", path, parts...);
}

// The random states' metadata keys: rank 0's where ember always kept them (so files from
// before per-rank states load as rank 0's), the other ranks' under keys of their own, and how
// many ranks' states the file holds (absent: 1).
constexpr const char* kRngRanks = "rng_ranks";
std::string rng_key(const std::string& name, int64_t rank, const char* field) {
  return rank == 0 ? "rng." + name + "." + field
                   : "rng_rank." + std::to_string(rank) + "." + name + "." + field;
}

// This process's generator states: seed, offset of each generator, in name order.
std::vector<int64_t> own_rng_states(const Checkpoint& c) {
  std::vector<int64_t> out;
  for (const auto& [name, gen] : c.generators) {
    EMBER_CHECK(gen != nullptr, "save_checkpoint", "generator \"", name, "\" is null");
    out.push_back(std::bit_cast<int64_t>(gen->seed()));
    out.push_back(std::bit_cast<int64_t>(gen->offset()));
  }
  return out;
}

// Every rank's own_rng_states, by rank: two all-gathers over `group`, the first checking that
// every rank names the same generators.
std::vector<std::vector<int64_t>> gather_rng_states(const Checkpoint& c, ProcessGroup& group) {
  const std::vector<int64_t> mine = own_rng_states(c);
  auto all_gather = [&group](const std::vector<int64_t>& values) {
    const auto n = static_cast<int64_t>(values.size());
    const Tensor input = from_vector<int64_t>(values, {n}).to(group.tensor_device());
    std::vector<Tensor> outputs;
    for (int r = 0; r < group.size(); ++r) outputs.push_back(empty({n}, input.options()));
    group.allgather(outputs, input)->wait();
    std::vector<std::vector<int64_t>> out;
    for (const Tensor& t : outputs) out.push_back(t.to_vector<int64_t>());
    return out;
  };
  uint64_t names = detail::kChecksumSeed;
  for (const auto& [name, gen] : c.generators) {
    names = detail::checksum(name.data(), name.size()) ^ (names * 1099511628211ull);
  }
  const auto described =
      all_gather({static_cast<int64_t>(mine.size()), std::bit_cast<int64_t>(names)});
  for (size_t r = 1; r < described.size(); ++r) {
    EMBER_CHECK(described[r] == described[0], "save_checkpoint", "rank ", r, " saves ",
                described[r][0] / 2, " generator(s) and rank 0 saves ", described[0][0] / 2,
                described[r][0] == described[0][0] ? " named differently" : "",
                "; every rank must save the same generators");
  }
  if (mine.empty()) return std::vector<std::vector<int64_t>>(described.size());
  return all_gather(mine);
}

// Builds the file of `c`, with the random states `rng` (by rank), and writes it to `path`.
void write_checkpoint(const std::string& path, const Checkpoint& c,
                      const std::vector<std::vector<int64_t>>& rng) {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> meta;
  if (c.model != nullptr) {
    for (const auto& [name, t] : c.model->state_dict()) tensors["model." + name] = t;
  }
  if (c.optimizer != nullptr) {
    const optim::StateDict sd = c.optimizer->state_dict();
    for (const auto& [key, t] : sd.tensors) tensors["optimizer." + key] = t;
    for (const auto& [key, v] : sd.scalars) meta["optimizer." + key] = detail::format_number(v);
  }
  if (c.scheduler != nullptr) {
    for (const auto& [key, v] : c.scheduler->state_dict().scalars)
      meta["scheduler." + key] = detail::format_number(v);
  }
  if (c.grad_scaler != nullptr) {
    for (const auto& [key, v] : c.grad_scaler->state_dict().scalars)
      meta["grad_scaler." + key] = detail::format_number(v);
  }
  if (!c.generators.empty()) {
    meta[kRngRanks] = std::to_string(rng.size());
    for (size_t r = 0; r < rng.size(); ++r) {
      size_t i = 0;
      for (const auto& [name, gen] : c.generators) {
        const auto rank = static_cast<int64_t>(r);
        meta[rng_key(name, rank, "seed")] = std::to_string(std::bit_cast<uint64_t>(rng[r][i]));
        meta[rng_key(name, rank, "offset")] =
            std::to_string(std::bit_cast<uint64_t>(rng[r][i + 1]));
        i += 2;
      }
    }
  }
  if (c.sampler != nullptr) {
    EMBER_CHECK(c.sampler_consumed >= 0 && c.sampler_consumed <= c.sampler->size(),
                "save_checkpoint", "sampler_consumed ", c.sampler_consumed, " is outside [0, ",
                c.sampler->size(), "] (the sampler's remaining indices)");
    for (const auto& [key, text] : c.sampler->state(c.sampler_consumed).to_strings())
      meta["sampler." + key] = text;  // in global terms: it loads on any number of ranks
  }
  for (const auto& [key, v] : c.values) meta["values." + key] = detail::format_number(v);
  for (const auto& [key, text] : c.texts) {
    bool utf8 = true;  // the header is JSON, whose strings are UTF-8
    try {
      (void)nlohmann::json(text).dump();
    } catch (const nlohmann::json::exception&) {
      utf8 = false;
    }
    EMBER_CHECK(utf8, "save_checkpoint", "text \"", key, "\" is not valid UTF-8");
    meta["texts." + key] = text;
  }
  meta["epoch"] = std::to_string(c.epoch);
  meta["step"] = std::to_string(c.step);
  detail::write_atomically("save_checkpoint", path,
                           detail::serialize_safetensors(tensors, std::move(meta), kFormat));
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& c, ProcessGroup* group) {
  if (group == nullptr && is_initialized() &&
      detail::default_group_for("save_checkpoint")->rank() != 0)
    return;  // not collective: rank 0 of the default group writes
  EMBER_CHECK(group == nullptr || group->is_member(), "save_checkpoint",
              "this rank is not a member of the group");
  if (group == nullptr || group->size() == 1) return write_checkpoint(path, c, {own_rng_states(c)});
  const CollectiveTag tag("save_checkpoint");  // what the flight recorder calls its collectives
  const std::vector<std::vector<int64_t>> rng = gather_rng_states(c, *group);
  std::string failure;  // rank 0's, told to the others
  if (group->rank() == 0) {
    try {
      write_checkpoint(path, c, rng);
    } catch (const Error& e) {
      failure = e.what();
    }
  }
  // Every rank returns once rank 0 has written, or fails with it.
  Tensor written = from_vector<int64_t>({failure.empty() ? 1 : 0}, {1}).to(group->tensor_device());
  group->broadcast(written, 0)->wait();
  if (!failure.empty()) throw Error(failure);
  EMBER_CHECK(written.item<int64_t>() == 1, "save_checkpoint", "rank 0 failed to write ", path,
              " (its error says why)");
}

CheckpointFile read_checkpoint(const std::string& path, Device device) {
  const detail::SafetensorsFile file("load_checkpoint", path);
  CheckpointFile out;
  out.metadata = file.metadata();
  // Entries are in file order, so their bytes in turn make up the data region's checksum.
  uint64_t sum = detail::kChecksumSeed;
  std::map<std::string, Tensor> tensors;
  for (const detail::SafetensorsEntry& e : file.entries()) {
    Tensor t = empty(e.shape, e.dtype);
    file.read(e.begin, t.data_ptr(), e.end - e.begin);
    sum = detail::checksum(static_cast<const char*>(t.data_ptr()), e.end - e.begin, sum);
    tensors[e.name] = std::move(t);
  }
  const auto expected = out.metadata.find("checksum");
  if (expected != out.metadata.end() && expected->second != std::to_string(sum))
    throw load_error(path, "the data checksum does not match the header (the file is corrupted)");
  for (auto& [name, t] : tensors) out.tensors[name] = device == kCPU ? t : t.to(device);
  return out;
}

std::map<std::string, std::string> read_checkpoint_metadata(const std::string& path) {
  return detail::SafetensorsFile("load_checkpoint", path).metadata();
}

void load_checkpoint(const std::string& path, Checkpoint& c, Device device,
                     const ProcessGroup* group) {
  // This rank of the loading group and its size.
  std::shared_ptr<ProcessGroup> default_group;
  if (group == nullptr && is_initialized())
    default_group = detail::default_group_for("load_checkpoint");
  const ProcessGroup* loading = group != nullptr ? group : default_group.get();
  EMBER_CHECK(loading == nullptr || loading->is_member(), "load_checkpoint",
              "this rank is not a member of the group");
  const int64_t rank = loading != nullptr ? loading->rank() : 0;
  const int64_t size = loading != nullptr ? loading->size() : 1;

  CheckpointFile file = read_checkpoint(path, device);
  auto fail = [&path](const auto&... parts) { return load_error(path, parts...); };
  auto meta = [&](const std::string& key) -> const std::string& {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) throw fail("the checkpoint has no \"", key, "\"");
    return it->second;
  };
  auto integer = [&](const std::string& key) -> uint64_t {
    const std::string& s = meta(key);
    uint64_t v = 0;
    if (!detail::parse_count(s, v))
      throw fail("metadata \"", key, "\" = \"", s, "\" is not an unsigned integer");
    return v;
  };
  auto real = [&](const std::string& key, const std::string& s) -> double {
    double v = 0;
    if (!detail::parse_number(s, v))
      throw fail("metadata \"", key, "\" = \"", s, "\" is not a number");
    return v;
  };
  auto with_prefix = [&](const std::string& prefix) {
    optim::StateDict sd;
    for (const auto& [key, t] : file.tensors) {
      if (key.rfind(prefix, 0) == 0) sd.tensors[key.substr(prefix.size())] = t;
    }
    for (const auto& [key, s] : file.metadata) {
      if (key.rfind(prefix, 0) == 0) sd.scalars[key.substr(prefix.size())] = real(key, s);
    }
    return sd;
  };
  auto it = file.metadata.find("format");
  if (it == file.metadata.end() || it->second != kFormat)
    throw fail("not an ember checkpoint (metadata \"format\" is ",
               it == file.metadata.end() ? std::string("missing") : "\"" + it->second + "\"",
               ", expected \"", kFormat, "\")");

  // Everything is read and checked before anything changes.
  const int64_t epoch = static_cast<int64_t>(integer("epoch"));
  const int64_t step = static_cast<int64_t>(integer("step"));
  std::map<std::string, std::pair<uint64_t, uint64_t>> rng;
  const bool per_rank = file.metadata.count(kRngRanks) != 0;
  const auto saved_ranks =
      static_cast<int64_t>(per_rank ? std::max<uint64_t>(integer(kRngRanks), 1) : 1);
  for (const auto& [name, gen] : c.generators) {
    const uint64_t seed0 = integer(rng_key(name, 0, "seed"));
    if (rank < saved_ranks)
      rng[name] = {integer(rng_key(name, rank, "seed")), integer(rng_key(name, rank, "offset"))};
    else  // a rank the run did not have: a fresh state derived from rank 0's seed
      rng[name] = per_rank ? std::pair{seed0 + static_cast<uint64_t>(rank), uint64_t{0}}
                           : std::pair{seed0, integer(rng_key(name, 0, "offset"))};
  }
  if (!c.generators.empty() && per_rank && saved_ranks != size && rank == 0) {
    auto ranks = [](int64_t first, int64_t last) {
      return first == last ? "rank " + std::to_string(first)
                           : ember::detail::str_cat("ranks ", first, " to ", last);
    };
    const std::string what = size > saved_ranks
                                 ? ranks(saved_ranks, size - 1) +
                                       (size - saved_ranks == 1 ? " starts" : " start") +
                                       " afresh (rank 0's seed + the rank, offset 0)"
                                 : "the states of " + ranks(size, saved_ranks - 1) + " go unused";
    std::fprintf(stderr,
                 "ember: warning: load_checkpoint: %s holds the random states of %lld rank%s and "
                 "is loaded on %lld: %s\n",
                 path.c_str(), static_cast<long long>(saved_ranks), saved_ranks == 1 ? "" : "s",
                 static_cast<long long>(size), what.c_str());
  }
  SamplerState sampler_state;
  if (c.sampler != nullptr) {
    try {
      sampler_state = c.sampler->state_from_strings(file.metadata, "sampler.");
    } catch (const Error& e) {
      throw fail(e.what());
    }
    const std::string why = c.sampler->refusal(sampler_state);
    if (!why.empty()) throw fail("the sampler cannot continue: ", why);
  }
  nn::NamedTensors model_state;
  if (c.model != nullptr) {
    const optim::StateDict sd = with_prefix("model.");
    for (const auto& [key, t] : sd.tensors) model_state.emplace_back(key, t);
  }
  const optim::StateDict optimizer_state = with_prefix("optimizer.");
  const optim::StateDict scheduler_state = with_prefix("scheduler.");
  const optim::StateDict values = with_prefix("values.");
  const optim::StateDict scaler_state = with_prefix("grad_scaler.");
  if (c.optimizer != nullptr && optimizer_state.scalars.empty())
    throw fail("the checkpoint holds no optimizer state");
  if (c.scheduler != nullptr && scheduler_state.scalars.empty())
    throw fail("the checkpoint holds no scheduler state");

  try {
    if (c.model != nullptr) c.model->load_state_dict(model_state, /*strict=*/true);
    if (c.optimizer != nullptr) c.optimizer->load_state_dict(optimizer_state);
    if (c.scheduler != nullptr) c.scheduler->load_state_dict(scheduler_state);
    if (c.grad_scaler != nullptr && !scaler_state.scalars.empty())
      c.grad_scaler->load_state_dict(scaler_state);
  } catch (const Error& e) {
    throw fail(e.what());
  }
  for (const auto& [name, gen] : c.generators) gen->set_state(rng[name].first, rng[name].second);
  if (c.sampler != nullptr) {
    c.sampler->load_state(sampler_state);
    c.sampler_consumed = 0;
  }
  c.values = values.scalars;
  c.texts.clear();
  for (const auto& [key, text] : file.metadata) {
    if (key.rfind("texts.", 0) == 0) c.texts[key.substr(6)] = text;
  }
  c.epoch = epoch;
  c.step = step;
}

}  // namespace ember::dist

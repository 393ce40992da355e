// The state the sharded snapshot tests save and load: a model's parameters and buffers
// (replicated), each parameter's optimizer moment held whole by one rank (parameter k by rank
// k % W, as PyTorch's ZeroRedundancyOptimizer partitions), and one flat buffer split unevenly
// by the caller. Every value follows from the tensor's name, so a rank of any world size knows
// what it must read back.
#pragma once

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <ember/dist/sharded_checkpoint.h>
#include <ember/tensor/random.h>

namespace ember::dist::testing {

struct ShardedTestState {
  // Name, full values.
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<Shape> parameter_shapes{{64, 32}, {64}, {128, 64}, {128}, {10, 128}, {10}};
  static constexpr int64_t kFlat = 20000;

  ShardedTestState() {
    uint64_t seed = 1;
    for (size_t k = 0; k < parameter_shapes.size(); ++k) {
      Generator gen(seed++);
      tensors.emplace_back("model.p" + std::to_string(k), randn(parameter_shapes[k], kF32, &gen));
    }
    tensors.emplace_back("model.running", arange(0, 24, 1, kF64).view({2, 3, 4}));
    tensors.emplace_back("model.count", full({}, 7, kI64));
    tensors.emplace_back("model.empty", zeros({0, 3}));
    for (size_t k = 0; k < parameter_shapes.size(); ++k) {
      Generator gen(seed++);
      tensors.emplace_back(moment(k), randn(parameter_shapes[k], kF32, &gen));
    }
    Generator gen(seed++);
    tensors.emplace_back("optimizer.flat", randn({kFlat}, kF32, &gen));
  }

  static std::string moment(size_t k) { return "optimizer.exp_avg." + std::to_string(k); }

  const Tensor& values_of(const std::string& name) const {
    for (const auto& [n, t] : tensors) {
      if (n == name) return t;
    }
    throw Error("ShardedTestState: no tensor " + name);
  }

  // The bound on what a rank allocates loading its share on at least as many ranks as saved
  // the snapshot in `dir`: the largest shard file plus the largest parameter.
  uint64_t load_bound(const std::string& dir) const {
    uint64_t largest = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().filename() != "index.json")
        largest = std::max<uint64_t>(largest, entry.file_size());
    }
    uint64_t parameter = 0;
    for (const auto& [name, t] : tensors) {
      if (name.rfind("model.p", 0) == 0) parameter = std::max<uint64_t>(parameter, t.nbytes());
    }
    return largest + parameter;
  }

  // Rank `rank` of `world`'s part of the flat buffer: rank 0 holds half, the others split the
  // rest evenly.
  static std::pair<int64_t, int64_t> flat_part(int64_t rank, int64_t world) {
    if (world == 1) return {0, kFlat};
    if (rank == 0) return {0, kFlat / 2};
    const auto [b, e] = even_split(kFlat - kFlat / 2, rank - 1, world - 1);
    return {kFlat / 2 + b, kFlat / 2 + e};
  }

  // What rank `rank` of `world` saves.
  ShardedState for_rank(int64_t rank, int64_t world) const {
    ShardedState s;
    for (const auto& [name, t] : tensors) {
      if (name.rfind("model.", 0) == 0) s.replicated[name] = t;
    }
    for (size_t k = 0; k < parameter_shapes.size(); ++k) {
      if (static_cast<int64_t>(k) % world == rank)
        s.sharded[moment(k)] = {parameter_shapes[k], 0, values_of(moment(k))};
    }
    const auto [b, e] = flat_part(rank, world);
    s.sharded["optimizer.flat"] = {{kFlat}, b, values_of("optimizer.flat").narrow(0, b, e - b)};
    s.metadata = {{"step", "12"},
                  {"owner." + std::to_string(rank), "rank " + std::to_string(rank)}};
    return s;
  }
};

}  // namespace ember::dist::testing

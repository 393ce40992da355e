// A sharded snapshot across a change of world size, one job per step (sharded_resize.sh):
//   sharded_resize_main save DIR      every rank saves its part of ShardedTestState
//   sharded_resize_main load DIR N    the snapshot N ranks saved, read at this job's size
// A loading rank takes the part a ZeRO rank of the new size owns: parameter k's moment whole
// where k % size == rank, and its even share of every tensor; every value must be the saved
// one, every element of every tensor read once across the ranks, and the bytes allocated
// while reading at most the largest shard plus one tensor once the job is as large as the
// saving one. Exits 1 naming the first difference.
#include <cstdio>

#include <ember/dist/init.h>
#include <ember/dist/sharded_checkpoint.h>
#include <ember/tensor/allocator.h>

#include "sharded_state.h"

namespace {

using namespace ember;
using namespace ember::dist;

void check(bool ok, const std::string& what) {
  if (!ok) throw Error("sharded_resize: " + what);
}

void load(ProcessGroup& pg, const std::string& dir, int64_t saved) {
  const testing::ShardedTestState state;
  const ShardedCheckpoint snapshot(dir);
  check(snapshot.world_size() == saved,
        "the snapshot says it was saved by " + std::to_string(snapshot.world_size()) + " ranks");
  const int64_t rank = pg.rank(), size = pg.size();
  const uint64_t bound = state.load_bound(dir);

  // Each rank's even share of every tensor, read at once and kept, as a new ZeRO rank would.
  const size_t before = cpu_memory_stats().allocated_bytes;
  reset_cpu_peak_memory_stats();
  std::vector<Tensor> shares;
  for (const auto& [name, full] : state.tensors) {
    const auto [b, e] = even_split(full.numel(), rank, size);
    shares.push_back(snapshot.read(name, b, e));
  }
  const size_t peak = cpu_memory_stats().peak_allocated_bytes - before;
  std::vector<int64_t> counts;
  for (size_t i = 0; i < shares.size(); ++i) {
    const auto& [name, full] = state.tensors[i];
    const auto [b, e] = even_split(full.numel(), rank, size);
    check(equal(shares[i], full.reshape({-1}).narrow(0, b, e - b)),
          "rank " + std::to_string(rank) + " read other values of " + name);
    counts.push_back(shares[i].numel());
  }
  if (size >= saved) {
    check(peak <= bound, "rank " + std::to_string(rank) + " allocated " + std::to_string(peak) +
                             " bytes reading its share, more than the largest shard plus the "
                             "largest parameter (" +
                             std::to_string(bound) + ")");
  }
  // The moments this rank owns at the new size, whole.
  for (size_t k = 0; k < state.parameter_shapes.size(); ++k) {
    if (static_cast<int64_t>(k) % size != rank) continue;
    const std::string name = testing::ShardedTestState::moment(k);
    check(equal(snapshot.read(name), state.values_of(name)),
          "rank " + std::to_string(rank) + " read other values of " + name);
  }
  // Every element once across the ranks.
  Tensor total = from_vector<int64_t>(counts, {static_cast<int64_t>(counts.size())});
  pg.allreduce(total)->wait();
  const auto sums = total.to_vector<int64_t>();
  for (size_t i = 0; i < sums.size(); ++i) {
    check(sums[i] == state.tensors[i].second.numel(),
          "the ranks read " + std::to_string(sums[i]) + " elements of " + state.tensors[i].first +
              ", which has " + std::to_string(state.tensors[i].second.numel()));
  }
  std::printf(
      "rank %lld of %lld: read the snapshot of %lld ranks, %zu bytes allocated (bound %llu)\n",
      static_cast<long long>(rank), static_cast<long long>(size), static_cast<long long>(saved),
      peak, static_cast<unsigned long long>(bound));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (argc < 3 || (mode != "save" && mode != "load") || (mode == "load" && argc < 4)) {
    std::fprintf(stderr, "usage: sharded_resize_main save DIR | load DIR SAVED_WORLD_SIZE\n");
    return 2;
  }
  try {
    InitOptions init;
    init.device = kCPU;
    init.group.timeout = std::chrono::seconds(60);
    auto pg = init_process_group(init);
    if (mode == "save") {
      const testing::ShardedTestState state;
      save_sharded_checkpoint(argv[2], state.for_rank(pg->rank(), pg->size()), *pg);
    } else {
      load(*pg, argv[2], std::stoll(argv[3]));
    }
    destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

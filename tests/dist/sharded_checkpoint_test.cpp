// Sharded snapshots: every rank writes its shard, any number of ranks reads back what it asks
// for (equal values, only what it asks for allocated), each shard is a plain safetensors file,
// and damaged or mismatched snapshots are refused with an error naming the file and field.
// (tests/dist/sharded_resize.sh runs the save at 3 ranks and loads at 2, 4 and 1.)
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <nlohmann/json.hpp>

#include <ember/dist/checkpoint.h>
#include <ember/dist/sharded_checkpoint.h>
#include <ember/optim/adam.h>
#include <ember/tensor/allocator.h>

#include "dist_test_util.h"
#include "raw_safetensors.h"
#include "sharded_state.h"
#include "shared_dir.h"

namespace ember::dist {
namespace {

namespace fs = std::filesystem;
using testing::ShardedTestState;
using testing::world;

// The test state, saved by every rank of the group into the folder `name` of a shared one.
struct Saved {
  std::shared_ptr<ProcessGroup> pg = world();
  testing::SharedDir folder{*pg, "ember_sharded_test_"};
  const ShardedTestState state;
  const std::string dir;

  explicit Saved(const std::string& name) : dir(folder.file(name)) {
    save_sharded_checkpoint(dir, mine(), *pg);
  }
  // What this rank saves.
  ShardedState mine() const { return state.for_rank(pg->rank(), pg->size()); }
};

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) out.insert(entry.path().filename());
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST(ShardedCheckpoint, EveryRankWritesItsShardAndAnyWorldSizeReadsItBack) {
  const Saved saved("snapshot");
  const auto& [pg, folder, state, dir] = saved;

  // One shard per rank and the index; nothing else.
  const nlohmann::json index = read_json(dir + "/index.json");
  const auto shards = index.at("shards").get<std::vector<std::string>>();
  ASSERT_EQ(static_cast<int>(shards.size()), pg->size());
  std::set<std::string> expected(shards.begin(), shards.end());
  expected.insert("index.json");
  EXPECT_EQ(files_in(dir), expected);
  EXPECT_EQ(index.at("world_size"), pg->size());
  EXPECT_EQ(index.at("tensors").at("model.p2").at("shape"), nlohmann::json({128, 64}));
  EXPECT_EQ(index.at("tensors").at("model.running").at("dtype"), "F64");

  const ShardedCheckpoint snapshot(dir);
  EXPECT_EQ(snapshot.world_size(), pg->size());
  EXPECT_EQ(snapshot.metadata().at("step"), "12");
  for (int r = 0; r < pg->size(); ++r)  // every rank's own keys, merged
    EXPECT_EQ(snapshot.metadata().at("owner." + std::to_string(r)), "rank " + std::to_string(r));
  EXPECT_EQ(snapshot.tensors().size(), state.tensors.size());
  EXPECT_EQ(snapshot.tensors().at("model.empty").shape, (Shape{0, 3}));
  for (const auto& [name, full] : state.tensors) {
    EXPECT_EQ(snapshot.tensors().at(name).dtype, full.dtype()) << name;
    EXPECT_TRUE(equal(snapshot.read(name), full)) << name;
  }
  // Each rank of 1 to 4 reads its even share of every tensor: equal values, each element once.
  for (int64_t size = 1; size <= 4; ++size) {
    for (const auto& [name, full] : state.tensors) {
      int64_t covered = 0;
      for (int64_t r = 0; r < size; ++r) {
        const auto [b, e] = even_split(full.numel(), r, size);
        const Tensor part = snapshot.read(name, b, e);
        EXPECT_TRUE(equal(part, full.reshape({-1}).narrow(0, b, e - b))) << name << " " << r;
        covered += part.numel();
      }
      EXPECT_EQ(covered, full.numel()) << name;
    }
  }
  // Into a model's own tensors, and converted on the way.
  auto model = std::make_shared<nn::Linear>(4, 3);
  Tensor into = empty({4, 16}, kF64).transpose(0, 1);
  snapshot.read_into("model.p2", 100, into);
  EXPECT_TRUE(equal(
      into, state.values_of("model.p2").reshape({-1}).narrow(0, 100, 64).view({16, 4}).to(kF64)));
  EXPECT_EMBER_ERROR(snapshot.read("model.p2", 8000, 8193),
                     "load_sharded_checkpoint: " + dir +
                         "/index.json: elements [8000, 8193) of tensor \"model.p2\" are outside "
                         "its 8192 elements");
  EXPECT_EMBER_ERROR(snapshot.read("model.nothing"),
                     "the snapshot has no tensor \"model.nothing\"");
}

// What load_module reads, and what it refuses before changing anything.
TEST(ShardedCheckpoint, LoadModuleReadsEveryTensorStrictly) {
  auto pg = world();
  testing::SharedDir folder(*pg, "ember_sharded_test_");
  manual_seed(3);
  auto saved = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(5, 7), std::make_shared<nn::BatchNorm1d>(7),
      std::make_shared<nn::Linear>(7, 2)});
  ShardedState state;
  for (const auto& [name, t] : saved->state_dict()) state.replicated["model." + name] = t;
  const std::string dir = folder.file("module");
  save_sharded_checkpoint(dir, state, *pg);

  manual_seed(4);
  auto loaded = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(5, 7), std::make_shared<nn::BatchNorm1d>(7),
      std::make_shared<nn::Linear>(7, 2)});
  const ShardedCheckpoint snapshot(dir);
  snapshot.load_module(*loaded);
  testing::expect_same_state(*loaded, *saved, 0, 0);

  auto other = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(5, 7), std::make_shared<nn::BatchNorm1d>(7),
      std::make_shared<nn::Linear>(7, 3)});
  const Tensor before = other->state_dict().front().second.clone();
  EXPECT_EMBER_ERROR(snapshot.load_module(*other),
                     "load_module (prefix \"model.\"): shape mismatch for 2.weight (snapshot "
                     "[2, 7], model [3, 7]), 2.bias (snapshot [2], model [3])");
  EXPECT_TRUE(equal(other->state_dict().front().second, before));  // nothing changed
  // A part of the model, by its prefix.
  auto linear = std::make_shared<nn::Linear>(5, 7);
  snapshot.load_module(*linear, "model.0.");
  EXPECT_TRUE(equal(linear->weight, saved->state_dict().front().second));
  EXPECT_EMBER_ERROR(snapshot.load_module(*linear),
                     "load_module (prefix \"model.\"): missing keys: weight, bias; unexpected "
                     "keys: 0.bias, 0.weight, 1.bias, ");
  EXPECT_EMBER_ERROR(snapshot.load_module(*linear, "model.x."),
                     "x.\"): missing keys: weight, bias");
}

// The parameter a state dict key "state.K.*" belongs to, or -1 for other keys.
int64_t parameter_of(const std::string& key) {
  if (key.rfind("state.", 0) != 0) return -1;
  return std::stoll(key.substr(6, key.find('.', 6) - 6));
}

// An optimizer's state sharded as ZeRO shards it (parameter k's state on rank k % size, the
// options on every rank), saved, and read back whole or by a rank of another world size.
TEST(ShardedCheckpoint, OptimizerStateSavedByItsOwnersAndReadBackByAnyRank) {
  auto pg = world();
  testing::SharedDir folder(*pg, "ember_sharded_test_");
  manual_seed(5);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 5), std::make_shared<nn::Linear>(5, 3)});
  optim::AdamW adam(model->parameters(), optim::AdamWOptions{.lr = 0.01});
  for (int i = 0; i < 2; ++i) {
    adam.zero_grad();
    mse_loss(model->forward(randn({4, 6})), randn({4, 3})).backward();
    adam.step();
  }
  optim::StateDict full = adam.state_dict();
  for (auto& [key, t] : full.tensors) t = t.clone();  // the live state goes on below
  optim::StateDict own;                               // what this rank would hold under ZeRO
  for (const auto& [key, t] : full.tensors) {
    if (parameter_of(key) % pg->size() == pg->rank()) own.tensors[key] = t;
  }
  for (const auto& [key, v] : full.scalars) {
    if (parameter_of(key) < 0 || parameter_of(key) % pg->size() == pg->rank()) own.scalars[key] = v;
  }
  ShardedState state;
  add_state_dict(state, own);
  EXPECT_EMBER_ERROR(add_state_dict(state, {{}, {{"param_groups.0.lr", 1.0}}}),
                     "add_state_dict: \"optimizer.param_groups.0.lr\" is in the state already");
  const std::string dir = folder.file("adam");
  save_sharded_checkpoint(dir, state, *pg);

  const ShardedCheckpoint snapshot(dir);
  const optim::StateDict read = snapshot.read_state_dict();
  EXPECT_EQ(read.scalars, full.scalars);
  ASSERT_EQ(read.tensors.size(), full.tensors.size());
  for (const auto& [key, t] : full.tensors) EXPECT_TRUE(equal(read.tensors.at(key), t)) << key;
  // A fresh optimizer takes it and steps as the saved one does.
  auto copy = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 5), std::make_shared<nn::Linear>(5, 3)});
  copy->load_state_dict(model->state_dict());
  optim::AdamW resumed(copy->parameters(), optim::AdamWOptions{.lr = 0.5});
  resumed.load_state_dict(read);
  const Tensor x = randn({4, 6}), y = randn({4, 3});
  auto step = [&x, &y](optim::Optimizer& optimizer, nn::Module& net) {
    optimizer.zero_grad();
    mse_loss(net.forward(x), y).backward();
    optimizer.step();
  };
  step(adam, *model);
  step(resumed, *copy);
  testing::expect_same_state(*copy, *model, 0, 0);
  // Rank 1 of 3 asks for its own parameters' state alone.
  const optim::StateDict mine = snapshot.read_state_dict(
      "optimizer.", [](const std::string& key) { return parameter_of(key) % 3 == 1; });
  EXPECT_EQ(mine.tensors.size(), 2u);  // parameter 1's exp_avg and exp_avg_sq
  EXPECT_TRUE(equal(mine.tensors.at("state.1.exp_avg"), full.tensors.at("state.1.exp_avg")));
}

// Each shard alone is a safetensors file: the same reader as whole checkpoints opens it, and
// its header says what Python's safetensors reads (1-D pieces, where they start, the shape).
TEST(ShardedCheckpoint, EachShardIsASafetensorsFile) {
  const Saved saved("plain");
  const auto& [pg, folder, state, dir] = saved;
  const auto shards = read_json(dir + "/index.json").at("shards").get<std::vector<std::string>>();
  const std::string path = dir + "/" + shards.at(static_cast<size_t>(pg->rank()));

  const testing::RawSafetensors raw(path);
  const auto& header = raw.header;
  const auto [b, e] = even_split(128 * 64, pg->rank(), pg->size());
  const auto& p2 = header.at("model.p2");
  EXPECT_EQ(p2.at("dtype"), "F32");
  EXPECT_EQ(p2.at("shape"), nlohmann::json({e - b}));
  const auto& meta = header.at("__metadata__");
  EXPECT_EQ(meta.at("format"), "ember.shard.v1");
  EXPECT_EQ(meta.at("ember.begin.model.p2"), std::to_string(b));
  EXPECT_EQ(meta.at("ember.shape.model.p2"), "[128,64]");
  EXPECT_EQ(meta.at("ember.rank"), std::to_string(pg->rank()));
  EXPECT_EQ(raw.floats("model.p2"),
            state.values_of("model.p2").reshape({-1}).narrow(0, b, e - b).to_vector<float>());

  const CheckpointFile file = read_checkpoint(path);
  // Parameter 0's moment is rank 0's alone.
  if (pg->rank() == 0) {
    EXPECT_TRUE(equal(file.tensors.at("optimizer.exp_avg.0"),
                      state.values_of("optimizer.exp_avg.0").reshape({-1})));
  } else {
    EXPECT_EQ(file.tensors.count("optimizer.exp_avg.0"), 0u);
  }
}

// Loading allocates what it returns and nothing else, so a rank of a larger world than the
// saving one holds at most the largest shard plus one tensor; a load into the model's own
// tensors allocates nothing.
TEST(ShardedCheckpoint, LoadingAllocatesOnlyWhatItReturns) {
  const Saved saved("memory");
  const auto& [pg, folder, state, dir] = saved;
  const ShardedCheckpoint snapshot(dir);
  uint64_t total = 0;
  for (const auto& [name, t] : state.tensors) total += t.nbytes();
  const uint64_t bound = state.load_bound(dir);
  // The check can fail: the whole state is more than the bound.
  if (pg->size() > 1) {
    EXPECT_GT(total, bound);
  }

  for (int64_t size = 1; size <= 4; ++size) {
    for (int64_t r = 0; r < size; ++r) {
      std::vector<Tensor> kept;
      const size_t before = cpu_memory_stats().allocated_bytes;
      reset_cpu_peak_memory_stats();
      for (const auto& [name, full] : state.tensors) {
        const auto [b, e] = even_split(full.numel(), r, size);
        kept.push_back(snapshot.read(name, b, e));
      }
      const CpuMemoryStats after = cpu_memory_stats();
      // Nothing transient: the peak is what the rank keeps.
      EXPECT_EQ(after.peak_allocated_bytes, after.allocated_bytes) << size << " " << r;
      if (size >= pg->size()) {
        EXPECT_LE(after.peak_allocated_bytes - before, bound) << size << " " << r;
      }
    }
  }
  // Into tensors that exist already: nothing allocated when they are contiguous CPU tensors of
  // the saved dtype, one tensor's worth otherwise.
  std::vector<Tensor> targets;
  for (const auto& [name, full] : state.tensors) targets.push_back(empty_like(full));
  Tensor converted = empty({128, 64}, kF64);
  const size_t before = cpu_memory_stats().allocated_bytes;
  reset_cpu_peak_memory_stats();
  for (size_t i = 0; i < targets.size(); ++i)
    snapshot.read_into(state.tensors[i].first, 0, targets[i]);
  EXPECT_EQ(cpu_memory_stats().peak_allocated_bytes, before);
  snapshot.read_into("model.p2", 0, converted);
  EXPECT_LE(cpu_memory_stats().peak_allocated_bytes - before, 2 * 128 * 64 * 4u);
  for (size_t i = 0; i < targets.size(); ++i)
    EXPECT_TRUE(equal(targets[i], state.tensors[i].second)) << state.tensors[i].first;
  EXPECT_TRUE(equal(converted, state.values_of("model.p2").to(kF64)));
}

// Writes `text` over `path`.
void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ShardedCheckpoint, DamagedSnapshotsAreRefusedNamingFileAndField) {
  const Saved saved("good");
  const auto& [pg, folder, state, good] = saved;
  const nlohmann::json index = read_json(good + "/index.json");
  const std::string shard0 = index.at("shards").at(0);
  // Each rank damages its own copies.
  int copies = 0;
  auto copy = [&] {
    const std::string dir =
        folder.file("rank" + std::to_string(pg->rank()) + "_" + std::to_string(copies++));
    fs::copy(good, dir);
    return dir;
  };

  std::string dir = copy();
  fs::remove(dir + "/" + shard0);
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir}, "load_sharded_checkpoint: " + dir + "/" + shard0 +
                                                 ": missing: rank 0's shard, named by the index");

  dir = copy();
  std::string bytes = read_text(dir + "/" + shard0);
  write_text(dir + "/" + shard0, bytes.substr(0, bytes.size() - 100));
  EXPECT_EMBER_ERROR(ShardedCheckpoint(dir).read("model.p2"), dir + "/" + shard0 + ": tensor \"");
  EXPECT_EMBER_ERROR(ShardedCheckpoint(dir).read("model.p2"), "(truncated file?)");

  dir = copy();
  bytes[bytes.size() - 4 * 100] ^= 0x10;  // in the flat buffer, rank 0's tensor last by name
  write_text(dir + "/" + shard0, bytes);
  const ShardedCheckpoint flipped(dir);
  EXPECT_TRUE(
      equal(flipped.read("model.p0"), state.values_of("model.p0")));  // other pieces are fine
  EXPECT_EMBER_ERROR(
      flipped.read("optimizer.flat", 0, 1),
      dir + "/" + shard0 + ": the data of tensor \"optimizer.flat\" does not match its checksum");

  auto with_index = [&](const std::function<void(nlohmann::json&)>& change) {
    const std::string d = copy();
    nlohmann::json changed = index;
    change(changed);
    write_text(d + "/index.json", changed.dump());
    return d;
  };
  dir = with_index(
      [](nlohmann::json& j) { j["shards"][0] = "../good/" + j["shards"][0].get<std::string>(); });
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir}, dir + "/index.json: rank 0's shard \"../good/" +
                                                 shard0 + "\" is not a file name in the folder");
  dir = with_index([](nlohmann::json& j) { j["shards"][0] = "/etc/passwd"; });
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir}, "is not a file name in the folder");
  dir = with_index([](nlohmann::json& j) { j["tensors"]["model.p1"]["shape"] = {65}; });
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir},
                     "tensor \"model.p1\": elements [64, 65) are held by no rank");
  dir = with_index([](nlohmann::json& j) { j["tensors"]["model.p1"]["shape"] = {8, 8}; });
  EXPECT_EMBER_ERROR(ShardedCheckpoint(dir).read("model.p1"),
                     "tensor \"model.p1\" is F32 [64] elements [0, ");
  dir = with_index([](nlohmann::json& j) { j["tensors"]["model.p1"]["pieces"][0]["end"] = 1000; });
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir}, "tensor \"model.p1\" of 64 elements has piece");
  dir = with_index([](nlohmann::json& j) { j["tensors"]["model.p1"]["shape"] = {1ull << 62, 8}; });
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir},
                     "tensor \"model.p1\" has shape [4611686018427387904,8]");
  // An index claiming 4 TiB held by one shard: refused from the shard's header before
  // anything is allocated for it.
  dir = with_index([](nlohmann::json& j) {
    j["tensors"]["model.p1"]["shape"] = {1ull << 40};
    j["tensors"]["model.p1"]["pieces"] = {{{"shard", 0}, {"begin", 0}, {"end", 1ull << 40}}};
  });
  EXPECT_EMBER_ERROR(ShardedCheckpoint(dir).read("model.p1"),
                     "elements [0, 1099511627776) in the index");
  dir = with_index([](nlohmann::json& j) { j["world_size"] = 1 << 30; });
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir}, "\"world_size\" is 1073741824, not in [1, 1048576]");
  dir = with_index([](nlohmann::json& j) { j["save"] = "0123456789abcdef"; });
  EXPECT_EMBER_ERROR(ShardedCheckpoint(dir).read("model.p0"),
                     "wants rank 0 of " + std::to_string(pg->size()) +
                         " of save 0123456789abcdef (a shard of another snapshot)");
  dir = with_index([](nlohmann::json& j) { j.erase("tensors"); });
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir}, "the index has no \"tensors\"");
  dir = copy();
  write_text(dir + "/index.json", "{\"format\": \"ember.sharded.v1\", ");
  EXPECT_EMBER_ERROR(ShardedCheckpoint{dir}, dir + "/index.json: the index is not valid JSON");
  EXPECT_EMBER_ERROR(
      ShardedCheckpoint{folder.file("nowhere")},
      "load_sharded_checkpoint: " + folder.file("nowhere") + "/index.json: cannot read the index");
}

// A rank that cannot write, or shards that do not fit together, fail the save on every rank;
// a later save replaces the snapshot whole and removes the shards no index names.
TEST(ShardedCheckpoint, FailuresFailEveryRankAndANewSaveReplacesTheOld) {
  const Saved saved("first");
  const auto& [pg, folder, state, first_dir] = saved;
  const std::string dir = folder.file("replaced");
  const int last = pg->size() - 1;

  ShardedState bad = saved.mine();
  if (pg->rank() == last) bad.metadata["ember.mine"] = "x";
  const std::string own = "save_sharded_checkpoint: metadata key \"ember.mine\" is reserved";
  if (pg->rank() == last) {
    EXPECT_EMBER_ERROR(save_sharded_checkpoint(dir, bad, *pg), own);
  } else {
    EXPECT_EMBER_ERROR(save_sharded_checkpoint(dir, bad, *pg),
                       "save_sharded_checkpoint: rank " + std::to_string(last) +
                           " failed to write its shard of " + dir);
  }
  EXPECT_FALSE(fs::exists(dir + "/index.json"));
  pg->barrier()->wait();
  if (pg->rank() == 0) {
    EXPECT_EQ(files_in(dir), std::set<std::string>{});
  }

  if (pg->size() > 1) {
    bad = saved.mine();
    bad.metadata["step"] = std::to_string(pg->rank());
    const std::string what = pg->rank() == 0
                                 ? "metadata \"step\" is \"0\" on rank 0 but \"1\" on rank 1"
                                 : "save_sharded_checkpoint: rank 0 failed to write the index";
    EXPECT_EMBER_ERROR(save_sharded_checkpoint(dir, bad, *pg), what);
    bad = saved.mine();
    bad.sharded["optimizer.flat"] = {{ShardedTestState::kFlat}, 0, zeros({10})};  // all at 0
    EXPECT_EMBER_ERROR(save_sharded_checkpoint(dir, bad, *pg),
                       pg->rank() == 0 ? "tensor \"optimizer.flat\": elements from 0 are held "
                                         "twice (ranks 0 and 1)"
                                       : "rank 0 failed to write the index");
  }
  bad = saved.mine();
  bad.sharded["optimizer.flat"].begin = ShardedTestState::kFlat;
  EXPECT_EMBER_ERROR(save_sharded_checkpoint(dir, bad, *pg),
                     "sharded tensor \"optimizer.flat\": elements [20000, ");
  EXPECT_EMBER_ERROR(save_sharded_checkpoint(dir, bad, *pg), "are outside its shape [20000]");

  save_sharded_checkpoint(dir, saved.mine(), *pg);
  const auto first = read_json(dir + "/index.json").at("shards");
  pg->barrier()->wait();
  ShardedState changed = saved.mine();
  changed.replicated["model.p1"] = full({64}, 2.5);
  save_sharded_checkpoint(dir, changed, *pg);
  const auto second = read_json(dir + "/index.json").at("shards");
  std::set<std::string> expected(second.begin(), second.end());
  expected.insert("index.json");
  EXPECT_EQ(files_in(dir), expected);  // the first save's shards and the failed saves' are gone
  EXPECT_NE(first, second);
  EXPECT_TRUE(equal(ShardedCheckpoint(dir).read("model.p1"), full({64}, 2.5)));
}

}  // namespace
}  // namespace ember::dist

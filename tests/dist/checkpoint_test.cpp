// Checkpoints: a run saved mid-epoch and resumed in fresh objects produces the same losses
// bit for bit as the uninterrupted run; the file is plain safetensors; damaged or mismatched
// files are rejected with an error naming the file and the problem. Also the metric helpers.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <ember/dist/checkpoint.h>
#include <ember/dist/ddp.h>
#include <ember/dist/metrics.h>

#include "dist_test_util.h"
#include "raw_safetensors.h"
#include "shared_dir.h"

namespace ember::dist {
namespace {

namespace fs = std::filesystem;
using testing::world;

// A folder every rank agrees on, emptied at the end.
class SharedDir : public testing::SharedDir {
 public:
  explicit SharedDir(ProcessGroup& pg) : testing::SharedDir(pg, "ember_checkpoint_test_") {}
};

// One training setup: model (with dropout, so the RNG state matters), SGD with momentum, a
// step schedule, and a sampler whose epochs are 2 steps long.
struct TrainingRun {
  static constexpr int64_t kBatch = 2;
  std::shared_ptr<ProcessGroup> pg;
  std::shared_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::SGD> sgd;
  std::unique_ptr<optim::StepLR> schedule;
  std::unique_ptr<DistributedSampler> sampler;
  Checkpoint ck;
  Tensor x, y;
  std::vector<float> losses;

  TrainingRun(std::shared_ptr<ProcessGroup> group, uint64_t init_seed) : pg(std::move(group)) {
    manual_seed(init_seed);
    auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
        std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::BatchNorm1d>(6),
        std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.3),
        std::make_shared<nn::Linear>(6, 3)});
    ddp = std::make_shared<DistributedDataParallel>(net, pg);
    optim::SGDOptions o;
    o.lr = 0.2;
    o.momentum = 0.9;
    sgd = std::make_unique<optim::SGD>(ddp->parameters(), o);
    schedule = std::make_unique<optim::StepLR>(*sgd, 1, 0.5);
    sampler = std::make_unique<DistributedSampler>(4 * pg->size(), *pg,
                                                   DistributedSamplerOptions{.seed = 1});
    Generator gen(99);
    x = randn({4 * pg->size(), 4}, kF32, &gen);
    y = randint(0, 3, {4 * pg->size()}, kI64, &gen);
    ck.model = &ddp->module();
    ck.optimizer = sgd.get();
    ck.scheduler = schedule.get();
    ck.generators = {{"default", &default_generator()}};
    ck.sampler = sampler.get();
  }

  void train_until(int64_t last_step) {
    while (ck.step < last_step) {
      sampler->set_epoch(static_cast<uint64_t>(ck.epoch));
      const auto order = sampler->indices();
      size_t used = 0;
      while (used + kBatch <= order.size() && ck.step < last_step) {
        const Tensor idx = from_vector<int64_t>({order[used], order[used + 1]}, {kBatch});
        Tensor loss = cross_entropy((*ddp)(index_select(x, 0, idx)), index_select(y, 0, idx));
        sgd->zero_grad();
        loss.backward();
        sgd->step();
        losses.push_back(loss.item<float>());
        used += kBatch;
        ++ck.step;
      }
      if (used < order.size()) {
        ck.sampler_consumed = static_cast<int64_t>(used);
        return;
      }
      ++ck.epoch;
      schedule->step();
    }
  }
};

TEST(Checkpoint, ResumedRunRepeatsTheLossesBitForBit) {
  auto pg = world();
  SharedDir dir(*pg);
  TrainingRun straight(pg, 1);
  manual_seed(1000);
  straight.train_until(7);

  TrainingRun first(pg, 1);
  manual_seed(1000);
  first.train_until(3);  // stops in the middle of epoch 1
  const std::string path = dir.file("run.safetensors");
  save_checkpoint(path, first.ck, pg.get());
  // Only the finished file is left: the temporary one was renamed.
  for (const auto& entry : fs::directory_iterator(dir.path()))
    EXPECT_EQ(entry.path().filename(), "run.safetensors");

  manual_seed(555);  // a different RNG state and initialisation, all overwritten by the load
  TrainingRun second(pg, 2);
  load_checkpoint(path, second.ck, kCPU);
  EXPECT_EQ(second.ck.step, 3);
  EXPECT_EQ(second.ck.epoch, 1);
  EXPECT_EQ(second.sampler->position(), 2);
  second.train_until(7);
  ASSERT_EQ(second.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(second.losses[i], straight.losses[3 + i]) << i;
  testing::expect_same_state(second.ddp->module(), straight.ddp->module(), 0, 0);
}

// The header and data as Python's safetensors reads them.
TEST(Checkpoint, FileIsSafetensors) {
  auto pg = world();
  SharedDir dir(*pg);
  TrainingRun run(pg, 1);
  run.train_until(1);
  run.ck.epoch = 4;
  const std::string path = dir.file("plain.safetensors");
  save_checkpoint(path, run.ck, pg.get());

  const testing::RawSafetensors raw(path);
  const auto& header = raw.header;
  const auto& w = header.at("model.0.weight");
  EXPECT_EQ(w.at("dtype"), "F32");
  EXPECT_EQ(w.at("shape"), nlohmann::json({6, 4}));
  EXPECT_EQ(header.at("model.1.num_batches_tracked").at("dtype"), "I64");
  EXPECT_TRUE(header.contains("optimizer.state.0.momentum_buffer"));
  EXPECT_EQ(header.at("__metadata__").at("epoch"), "4");
  // The weight's bytes are the weight's values.
  const Tensor weight = run.ddp->module().named_parameters()[0].second;
  EXPECT_EQ(raw.floats("model.0.weight"), weight.to_vector<float>());

  const CheckpointFile file = read_checkpoint(path);
  EXPECT_EQ(file.tensors.at("model.0.weight").sizes(), (Shape{6, 4}));
  EXPECT_EQ(file.metadata.at("step"), "1");
}

TEST(Checkpoint, TextsRoundTripAsUtf8AndRefuseOtherBytes) {
  auto pg = world();
  SharedDir dir(*pg);
  TrainingRun run(pg, 1);
  run.ck.texts = {{"vocab", "\n !abc\xc3\xa9\xe2\x82\xac"}, {"model", "gpt"}};
  const std::string path = dir.file("texts.safetensors");
  save_checkpoint(path, run.ck, pg.get());
  EXPECT_EQ(read_checkpoint_metadata(path).at("texts.vocab"), run.ck.texts.at("vocab"));

  Checkpoint loaded = run.ck;
  loaded.texts = {{"stale", "dropped"}};
  load_checkpoint(path, loaded);
  EXPECT_EQ(loaded.texts, run.ck.texts);

  run.ck.texts = {{"bytes", std::string("a\xff")}};
  EXPECT_EMBER_ERROR(save_checkpoint(dir.file("bad.safetensors"), run.ck, nullptr),
                     "save_checkpoint: text \"bytes\" is not valid UTF-8");
}

// Writes a safetensors file with the given header text and data.
void write_raw(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t length = header.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << header << data;
}

TEST(Checkpoint, DamagedOrMismatchedFilesAreRejected) {
  auto pg = world();
  SharedDir dir(*pg);
  TrainingRun run(pg, 1);
  const std::string good = dir.file("good.safetensors");
  save_checkpoint(good, run.ck, pg.get());
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // Each rank damages its own copies.
  const std::string mine = "rank" + std::to_string(pg->rank()) + "_";
  auto variant = [&](const std::string& name, const std::string& content) {
    const std::string path = dir.file(mine + name);
    std::ofstream(path, std::ios::binary) << content;
    return path;
  };
  TrainingRun target(pg, 2);
  const std::string truncated = variant("truncated", bytes.substr(0, bytes.size() - 40));
  EXPECT_EMBER_ERROR(load_checkpoint(truncated, target.ck), truncated + ": tensor \"");
  EXPECT_EMBER_ERROR(load_checkpoint(truncated, target.ck), "outside the data region");
  const std::string stub = variant("stub", bytes.substr(0, 5));
  EXPECT_EMBER_ERROR(load_checkpoint(stub, target.ck), "too short for a safetensors header");
  const std::string cut_header = variant("cut_header", bytes.substr(0, 60));
  EXPECT_EMBER_ERROR(load_checkpoint(cut_header, target.ck), "truncated or not a checkpoint");
  std::string flipped = bytes;
  flipped[flipped.size() - 3] ^= 0x10;
  EXPECT_EMBER_ERROR(load_checkpoint(variant("flipped", flipped), target.ck), "checksum");
  std::string bad_dtype = bytes;
  bad_dtype.replace(bad_dtype.find("\"F32\""), 5, "\"F33\"");
  EXPECT_EMBER_ERROR(load_checkpoint(variant("dtype", bad_dtype), target.ck),
                     "unknown dtype \"F33\"");
  std::string bad_json = bytes;
  bad_json[8] = '[';
  EXPECT_EMBER_ERROR(load_checkpoint(variant("json", bad_json), target.ck), "not valid JSON");

  const std::string gap = dir.file(mine + "gap");
  write_raw(gap, R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "12345678");
  EXPECT_EMBER_ERROR(read_checkpoint(gap), "without gaps or overlaps");
  const std::string size = dir.file(mine + "size");
  write_raw(size, R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,8]}})", "12345678");
  EXPECT_EMBER_ERROR(read_checkpoint(size), "needs 16 bytes but data_offsets span 8");
  // Empty tensors sit at the offset of the next one, in any order of the header.
  const std::string empties = dir.file(mine + "empties");
  write_raw(empties,
            R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
            R"("c":{"dtype":"F32","shape":[0,2],"data_offsets":[4,4]}})",
            "12345678");
  EXPECT_EQ(read_checkpoint(empties).tensors.at("c").sizes(), (Shape{0, 2}));
  // Sizes whose product overflows are refused before anything is allocated from them, as is
  // a header longer than safetensors allows (a sparse file, cheap to make).
  const std::string huge = dir.file(mine + "huge");
  write_raw(huge, R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})",
            "");
  EXPECT_EMBER_ERROR(read_checkpoint(huge), "tensor \"a\" has shape [4294967296,4294967296]");
  write_raw(huge, R"({"a":{"dtype":"F32","shape":[0,4611686018427387904,4],"data_offsets":[0,0]}})",
            "");
  EXPECT_EMBER_ERROR(read_checkpoint(huge), "tensor \"a\" has shape [0,4611686018427387904,4]");
  {
    std::ofstream out(huge, std::ios::binary | std::ios::trunc);
    const uint64_t length = 150'000'000;
    out.write(reinterpret_cast<const char*>(&length), 8);
  }
  fs::resize_file(huge, 150'000'100);
  EXPECT_EMBER_ERROR(
      read_checkpoint_metadata(huge),
      "the header claims 150000000 bytes, more than safetensors' limit of 100000000");
  fs::remove(huge);
  const std::string foreign = dir.file(mine + "foreign");
  write_raw(foreign, R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  EXPECT_EQ(read_checkpoint(foreign).tensors.at("a").item<int64_t>(), 'x');
  EXPECT_EMBER_ERROR(load_checkpoint(foreign, target.ck), "not an ember checkpoint");

  // A model of another shape: the error names the file and the parameter.
  auto other = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::BatchNorm1d>(6),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Dropout>(0.3),
      std::make_shared<nn::Linear>(6, 5)});
  Checkpoint wrong;
  wrong.model = other.get();
  EXPECT_EMBER_ERROR(load_checkpoint(good, wrong),
                     good +
                         ": load_state_dict: shape mismatch for 4.weight (checkpoint [3, 6], "
                         "model [5, 6])");
  auto linear = std::make_shared<nn::Linear>(4, 3);
  wrong.model = linear.get();
  EXPECT_EMBER_ERROR(load_checkpoint(good, wrong), "missing keys: weight, bias");
  // Nothing was changed by the failed loads.
  testing::expect_same_state(target.ddp->module(), *TrainingRun(pg, 2).ddp->module_ptr(), 0, 0);
}

// A save removes the temporary files of writers that died mid-save (nobody holds their lock),
// not those of a writer still at work; other files stay.
TEST(Checkpoint, StaleTemporaryFilesGoAtTheNextSave) {
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("ember_checkpoint_stale_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto model = std::make_shared<nn::Linear>(3, 2);
  Checkpoint ck;
  ck.model = model.get();
  ck.step = 7;
  ck.values = {{"loss_sum", 0.1}, {"seen", 3}};
  const std::string path = (dir / "snapshot.safetensors").string();
  save_checkpoint(path, ck);
  for (const char* name : {"snapshot.safetensors.tmp.123", "older.safetensors.tmp.99999999",
                           "busy.safetensors.tmp.4", "notes.tmp", "data.tmp.x"})
    std::ofstream(dir / name) << "partial";
  // A live writer holds its temporary file's lock while it writes.
  const int busy = ::open((dir / "busy.safetensors.tmp.4").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(busy, 0);
  ASSERT_EQ(::flock(busy, LOCK_EX), 0);
  save_checkpoint(path, ck);
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir)) left.insert(entry.path().filename());
  EXPECT_EQ(left, (std::set<std::string>{"snapshot.safetensors", "busy.safetensors.tmp.4",
                                         "notes.tmp", "data.tmp.x"}));
  ::close(busy);  // the writer died: its file goes at the next save
  save_checkpoint(path, ck);
  EXPECT_FALSE(fs::exists(dir / "busy.safetensors.tmp.4"));

  // The header alone, and the caller's values restored exactly.
  const auto meta = read_checkpoint_metadata(path);
  EXPECT_EQ(meta.at("step"), "7");
  ck.values.clear();
  load_checkpoint(path, ck);
  EXPECT_EQ(ck.values, (std::map<std::string, double>{{"loss_sum", 0.1}, {"seen", 3}}));
  fs::resize_file(path, 20);
  EXPECT_EMBER_ERROR(read_checkpoint_metadata(path), "the header claims");
  fs::remove_all(dir);
}

// A model whose every parameter holds `value`, and a checkpoint of it and of `gen`.
struct Filled {
  std::shared_ptr<nn::Linear> model = std::make_shared<nn::Linear>(3, 2);
  Checkpoint ck;
  Filled(double value, Generator& gen) {
    for (Tensor& p : model->parameters()) Tensor(p.detach()).fill_(value);
    ck.model = model.get();
    ck.generators = {{"data", &gen}};
  }
};

// The weight a checkpoint file holds (every element alike).
double saved_weight(const std::string& path) {
  return read_checkpoint(path).tensors.at("model.weight").to_vector<float>().front();
}

uint64_t inode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<uint64_t>(st.st_ino);
}

// save_checkpoint(path, ck) after init_process_group() on every rank, as a PyTorch user calls
// torch.save: rank 0 writes, the others return at once, writing nothing.
TEST(Checkpoint, WithoutAGroupOnlyRankZeroOfTheDefaultGroupWrites) {
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(testing::cpu_init());
  SharedDir dir(*pg);
  const std::string path = dir.file("unguarded.safetensors");
  Generator gen(100 + static_cast<uint64_t>(pg->rank()));
  Filled mine(pg->rank() + 1.0, gen);
  save_checkpoint(path, mine.ck);  // every rank, at once
  barrier();
  EXPECT_EQ(saved_weight(path), 1.0);  // rank 0's
  const auto meta = read_checkpoint_metadata(path);
  EXPECT_EQ(meta.at("rng.data.seed"), "100");
  EXPECT_EQ(meta.at("rng_ranks"), "1");
  EXPECT_EQ(meta.count("rng_rank.1.data.seed"), 0u);

  // The other ranks alone, one after another, with a checkpoint that could not even be
  // written (its text is not UTF-8): they return at once and the file is rank 0's, untouched.
  const uint64_t inode = inode_of(path);
  if (pg->rank() != 0) {
    mine.ck.texts = {{"bytes", std::string("a\xff")}};
    save_checkpoint(path, mine.ck);
  }
  barrier();
  EXPECT_EQ(inode_of(path), inode);  // no rename since rank 0's
  EXPECT_EQ(saved_weight(path), 1.0);
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir.path()))
    files.insert(entry.path().filename());
  EXPECT_EQ(files, std::set<std::string>{"unguarded.safetensors"});
}

// The tutorial's guard, `if rank == 0: save`, written as the user writes it: rank 0 writes
// and goes on without waiting for the others (no barrier inside), so it cannot hang.
TEST(Checkpoint, RankZeroAloneUnderTheTutorialsGuardWritesWithoutWaiting) {
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(testing::cpu_init(std::chrono::seconds(20)));
  SharedDir dir(*pg);
  const std::string path = dir.file("guarded.safetensors");
  Generator gen(7);
  Filled mine(pg->rank() + 1.0, gen);
  if (get_rank() == 0) save_checkpoint(path, mine.ck);
  barrier();  // a save waiting for the others would meet this barrier and fail
  EXPECT_EQ(saved_weight(path), 1.0);
}

TEST(Checkpoint, ASingleProcessWithoutAGroupWrites) {
  ASSERT_FALSE(is_initialized());
  // Under a launcher every process is a single process here: each writes its own file.
  const fs::path path = fs::path(::testing::TempDir()) /
                        ("ember_checkpoint_single_" + std::to_string(::getpid()) + ".safetensors");
  Generator gen(5);
  Filled mine(3.0, gen);
  save_checkpoint(path.string(), mine.ck);
  EXPECT_EQ(saved_weight(path.string()), 3.0);
  EXPECT_EQ(read_checkpoint_metadata(path.string()).at("rng.data.seed"), "5");
  fs::remove(path);
}

// Each rank seeds differently (as with a fresh seed per process): a save with the group keeps
// every rank's generators, and the load gives each rank its own back, so it draws again what
// it drew after the save.
TEST(Checkpoint, WithTheGroupEveryRankGetsItsOwnRandomStateBack) {
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(testing::cpu_init());
  SharedDir dir(*pg);
  const std::string path = dir.file("states.safetensors");
  const auto rank = static_cast<uint64_t>(pg->rank());
  Generator data(1000 + 17 * rank);
  manual_seed(50 + rank);
  (void)randn({3 + static_cast<int64_t>(rank)});  // offsets differ too
  (void)rand({2}, kF32, &data);
  Checkpoint ck;
  ck.generators = {{"default", &default_generator()}, {"data", &data}};
  save_checkpoint(path, ck, pg.get());
  const std::vector<float> drawn = randn({6}).to_vector<float>();
  const std::vector<float> drawn_data = rand({4}, kF32, &data).to_vector<float>();
  (void)randn({10});  // both go on
  (void)rand({10}, kF32, &data);

  const auto meta = read_checkpoint_metadata(path);
  EXPECT_EQ(meta.at("rng_ranks"), std::to_string(pg->size()));
  EXPECT_EQ(meta.at("rng.data.seed"), "1000");  // rank 0's where ember always kept it
  if (pg->size() > 1) {
    EXPECT_EQ(meta.at("rng_rank.1.data.seed"), "1017");
  }

  load_checkpoint(path, ck);  // the default group's rank picks the states
  EXPECT_EQ(default_generator().seed(), 50 + rank);
  EXPECT_EQ(data.seed(), 1000 + 17 * rank);
  EXPECT_EQ(randn({6}).to_vector<float>(), drawn);
  EXPECT_EQ(rand({4}, kF32, &data).to_vector<float>(), drawn_data);

  // Ranks that name different generators are refused on every rank, before anything is written.
  if (pg->size() > 1) {
    Generator extra(1);
    if (pg->rank() == 1) ck.generators["extra"] = &extra;
    EXPECT_EMBER_ERROR(save_checkpoint(dir.file("refused.safetensors"), ck, pg.get()),
                       "save_checkpoint: rank 1 saves 3 generator(s) and rank 0 saves 2; every "
                       "rank must save the same generators");
    barrier();
    EXPECT_FALSE(fs::exists(dir.file("refused.safetensors")));
  }
}

// A collective save that rank 0 cannot write fails on every rank, promptly, and the group
// goes on working.
TEST(Checkpoint, AGroupedSaveRankZeroCannotWriteFailsEverywhere) {
  auto pg = world();
  SharedDir dir(*pg);
  const std::string path = dir.file("no/such/folder/ck.safetensors");
  Generator gen(1);
  Filled mine(1.0, gen);
  if (pg->rank() == 0) {
    EXPECT_EMBER_ERROR(save_checkpoint(path, mine.ck, pg.get()), "save_checkpoint: cannot create");
  } else {
    EXPECT_EMBER_ERROR(save_checkpoint(path, mine.ck, pg.get()),
                       "save_checkpoint: rank 0 failed to write " + path);
  }
  Tensor t = ones({2});
  pg->allreduce(t)->wait();
  ::ember::testing::expect_close(t, full({2}, pg->size()));
}

// A group of any rank and size that communicates nothing: load_checkpoint only asks it who
// this rank is.
class RankOnly : public ProcessGroup {
 public:
  RankOnly(int rank, int size) : ProcessGroup(rank, size, 0) {}
  std::string backend() const override { return "none"; }
  WorkHandle allreduce(const Tensor&, ReduceOp) override { return refuse(); }
  WorkHandle broadcast(const Tensor&, int) override { return refuse(); }
  WorkHandle allgather(const std::vector<Tensor>&, const Tensor&) override { return refuse(); }
  WorkHandle reduce(const Tensor&, int, ReduceOp) override { return refuse(); }
  WorkHandle reduce_scatter(const Tensor&, const std::vector<Tensor>&, ReduceOp) override {
    return refuse();
  }
  WorkHandle barrier() override { return refuse(); }
  WorkHandle send(const Tensor&, int, int) override { return refuse(); }
  WorkHandle recv(const Tensor&, int, int) override { return refuse(); }

 private:
  static WorkHandle refuse() { throw Error("RankOnly: communicates nothing"); }
};

// Files holding N ranks' states loaded on M ranks; and files from before per-rank states.
TEST(Checkpoint, RandomStatesLoadedOnAnotherNumberOfRanks) {
  const fs::path path = fs::path(::testing::TempDir()) /
                        ("ember_checkpoint_ranks_" + std::to_string(::getpid()) + ".safetensors");
  // What a save with a group of 3 writes (no tensors).
  write_raw(path.string(),
            R"({"__metadata__":{"format":"ember.checkpoint.v1","epoch":"0","step":"0",)"
            R"("rng_ranks":"3","rng.g.seed":"10","rng.g.offset":"1","rng_rank.1.g.seed":"11",)"
            R"("rng_rank.1.g.offset":"2","rng_rank.2.g.seed":"12","rng_rank.2.g.offset":"3"}})",
            "");
  Generator gen;
  Checkpoint ck;
  ck.generators = {{"g", &gen}};
  auto load_as = [&](int rank, int size) {
    RankOnly group(rank, size);
    ::testing::internal::CaptureStderr();
    load_checkpoint(path.string(), ck, kCPU, &group);
    const std::string warning = ::testing::internal::GetCapturedStderr();
    return std::make_tuple(gen.seed(), gen.offset(), warning);
  };
  EXPECT_EQ(load_as(2, 3), std::make_tuple(uint64_t{12}, uint64_t{3}, std::string()));
  EXPECT_EQ(load_as(1, 4), std::make_tuple(uint64_t{11}, uint64_t{2}, std::string()));
  // A rank the saving run did not have starts afresh: rank 0's seed + its rank, offset 0.
  EXPECT_EQ(load_as(3, 4), std::make_tuple(uint64_t{13}, uint64_t{0}, std::string()));
  EXPECT_EQ(load_as(4, 5), std::make_tuple(uint64_t{14}, uint64_t{0}, std::string()));
  EXPECT_EQ(std::get<2>(load_as(0, 4)),
            "ember: warning: load_checkpoint: " + path.string() +
                " holds the random states of 3 ranks and is loaded on 4: rank 3 starts afresh "
                "(rank 0's seed + the rank, offset 0)\n");
  EXPECT_EQ(std::get<2>(load_as(0, 1)),
            "ember: warning: load_checkpoint: " + path.string() +
                " holds the random states of 3 ranks and is loaded on 1: the states of ranks 1 to "
                "2 go unused\n");
  // Without a group or a default group: a single process, rank 0.
  ASSERT_FALSE(is_initialized());
  gen.set_state(0, 0);
  ::testing::internal::CaptureStderr();
  load_checkpoint(path.string(), ck);
  EXPECT_NE(::testing::internal::GetCapturedStderr().find("is loaded on 1"), std::string::npos);
  EXPECT_EQ(gen.seed(), 10u);

  // A file written before per-rank states (or without a group): every rank takes rank 0's,
  // without a warning.
  write_raw(path.string(),
            R"({"__metadata__":{"format":"ember.checkpoint.v1","epoch":"2","step":"9",)"
            R"("rng.g.seed":"20","rng.g.offset":"5"}})",
            "");
  EXPECT_EQ(load_as(1, 2), std::make_tuple(uint64_t{20}, uint64_t{5}, std::string()));
  EXPECT_EQ(load_as(0, 2), std::make_tuple(uint64_t{20}, uint64_t{5}, std::string()));
  EXPECT_EQ(ck.step, 9);
  fs::remove(path);
}

TEST(Metrics, AveragesNamedValuesAndLogsOnRankZero) {
  auto pg = world();
  const double r = pg->rank(), w = pg->size();
  const auto mean = average_across_ranks({{"loss", r}, {"accuracy", 2 * r + 1}}, *pg);
  EXPECT_DOUBLE_EQ(mean.at("loss"), (w - 1) / 2);
  EXPECT_DOUBLE_EQ(mean.at("accuracy"), w);
  if (pg->size() > 1) {
    EXPECT_EMBER_ERROR(average_across_ranks({{pg->rank() == 1 ? "lost" : "loss", 1.0}}, *pg),
                       "the value names on rank");
  }
  std::ostringstream out;
  RankZeroLogger log(*pg, out);
  log.log_metrics("epoch 3", mean);
  EXPECT_EQ(log.enabled(), pg->rank() == 0);
  if (pg->rank() == 0) {
    std::ostringstream expected;
    expected << "epoch 3 accuracy=" << w << " loss=" << (w - 1) / 2 << "\n";
    EXPECT_EQ(out.str(), expected.str());
  } else {
    EXPECT_EQ(out.str(), "");
  }
}

}  // namespace
}  // namespace ember::dist

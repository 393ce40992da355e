// Checkpoints: a run saved mid-epoch and resumed in fresh objects produces the same losses
// bit for bit as the uninterrupted run; the file is plain safetensors; damaged or mismatched
// files are rejected with an error naming the file and the problem. Also the metric helpers.
#include <fcntl.h>
#include <sys/file.h>
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

namespace ember::dist {
namespace {

namespace fs = std::filesystem;
using testing::world;

// A folder every rank agrees on (rank 0's pid names it), emptied at the end.
class SharedDir {
 public:
  explicit SharedDir(ProcessGroup& pg) : pg_(pg) {
    Tensor pid = from_vector<int64_t>({static_cast<int64_t>(::getpid())}, {1});
    pg.broadcast(pid, 0)->wait();
    path_ = fs::path(::testing::TempDir()) /
            ("ember_checkpoint_test_" + std::to_string(pid.item<int64_t>()));
    fs::create_directories(path_);
  }
  ~SharedDir() {
    pg_.barrier()->wait();
    if (pg_.rank() == 0) fs::remove_all(path_);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const fs::path& path() const { return path_; }

 private:
  ProcessGroup& pg_;
  fs::path path_;
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

  std::ifstream in(path, std::ios::binary);
  uint64_t length = 0;
  in.read(reinterpret_cast<char*>(&length), 8);
  EXPECT_EQ(length % 8, 0u);
  std::string text(length, '\0');
  in.read(text.data(), static_cast<std::streamsize>(length));
  const auto header = nlohmann::json::parse(text);
  const auto& w = header.at("model.0.weight");
  EXPECT_EQ(w.at("dtype"), "F32");
  EXPECT_EQ(w.at("shape"), nlohmann::json({6, 4}));
  EXPECT_EQ(header.at("model.1.num_batches_tracked").at("dtype"), "I64");
  EXPECT_TRUE(header.contains("optimizer.state.0.momentum_buffer"));
  EXPECT_EQ(header.at("__metadata__").at("epoch"), "4");
  // The weight's bytes are the weight's values.
  const auto offsets = w.at("data_offsets").get<std::vector<uint64_t>>();
  std::vector<float> values((offsets[1] - offsets[0]) / 4);
  in.seekg(static_cast<std::streamoff>(8 + length + offsets[0]));
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * 4));
  const Tensor weight = run.ddp->module().named_parameters()[0].second;
  EXPECT_EQ(values, weight.to_vector<float>());

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

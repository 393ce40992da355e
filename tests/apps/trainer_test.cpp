// ember-train's Trainer: one optimizer step per batch with accumulation and clipping, the
// parameter groups, and the metrics an epoch writes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <ember/dist/distributed_sampler.h>
#include <ember/dist/single_process_group.h>
#include <ember/ember.h>

#include "small_model.h"
#include "test_util.h"
#include "trainer.h"

namespace fs = std::filesystem;

namespace ember::apps {
namespace {

using testing::flat_parameters;
using testing::make_sgd;
using testing::random_batch;
using testing::small_model;

void expect_close(const std::vector<float>& a, const std::vector<float>& b, float tolerance) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], tolerance) << "element " << i;
}

TEST(Trainer, AccumulatedMicroBatchesEqualOneBatch) {
  dist::SingleProcessGroup group;
  TrainOptions whole, split;
  split.accum_steps = 4;
  auto model_a = small_model(), model_b = small_model();
  auto sgd_a = make_sgd(*model_a), sgd_b = make_sgd(*model_b);
  Trainer a(whole, *model_a, *model_a, *sgd_a, nullptr, group, kCPU);
  Trainer b(split, *model_b, *model_b, *sgd_b, nullptr, group, kCPU);
  for (uint64_t step = 0; step < 3; ++step) {
    const data::Batch batch = random_batch(16, 100 + step);
    const BatchResult ra = a.run_batch(batch), rb = b.run_batch(batch);
    EXPECT_NEAR(ra.loss_value(), rb.loss_value(), 1e-5);
    EXPECT_EQ(ra.correct_value(), rb.correct_value());
    EXPECT_EQ(rb.count, 16);
  }
  EXPECT_EQ(b.step(), 3);
  expect_close(flat_parameters(*model_a), flat_parameters(*model_b), 1e-5f);
  // The test can fail: without the 1/K scaling the steps differ.
  EXPECT_THROW(b.run_batch(random_batch(10, 1)), Error);  // 10 is not 4 equal parts
}

// A model whose logits keep their classes in dim 1 beside extra dims ([N, C, L] against
// targets [N, L], as a segmentation model's) is scored as PyTorch's cross_entropy reads it; only
// --model gpt puts its classes last.
TEST(Trainer, LogitsWithClassesInDimOneAreScoredAsCrossEntropyReadsThem) {
  struct PerPosition : nn::Module {
    PerPosition() { register_module("proj", proj); }
    std::shared_ptr<nn::Linear> proj = std::make_shared<nn::Linear>(8, 12);
    Tensor forward(const Tensor& x) override { return proj->forward(x).reshape({-1, 3, 4}); }
    std::string name() const override { return "PerPosition"; }
  };
  dist::SingleProcessGroup group;
  TrainOptions o;
  o.label_smoothing = 0.1;
  manual_seed(3);
  PerPosition model;
  auto sgd = make_sgd(model);
  Trainer trainer(o, model, model, *sgd, nullptr, group, kCPU);
  data::Batch batch = random_batch(16, 7);
  batch.target = randint(0, 3, {16, 4});
  const double expected =
      cross_entropy(model.forward(batch.data), batch.target, {.label_smoothing = 0.1})
          .item<double>();
  const BatchResult r = trainer.run_batch(batch);
  EXPECT_NEAR(r.loss_value(), expected, 1e-6);
  EXPECT_EQ(r.count, 64);
}

TEST(Trainer, ClippingIsClipGradNorm) {
  dist::SingleProcessGroup group;
  TrainOptions o;
  o.grad_clip = 0.05;
  o.label_smoothing = 0.1;
  auto model = small_model(), reference = small_model(), unclipped = small_model();
  auto sgd = make_sgd(*model), sgd_ref = make_sgd(*reference), sgd_raw = make_sgd(*unclipped);
  Trainer trainer(o, *model, *model, *sgd, nullptr, group, kCPU);
  TrainOptions no_clip;
  no_clip.label_smoothing = 0.1;
  Trainer raw(no_clip, *unclipped, *unclipped, *sgd_raw, nullptr, group, kCPU);
  const data::Batch batch = random_batch(16, 5);
  trainer.run_batch(batch);
  raw.run_batch(batch);
  // What a PyTorch user writes: forward, loss, backward, clip_grad_norm_, step.
  sgd_ref->zero_grad();
  const Tensor loss =
      cross_entropy(reference->forward(batch.data), batch.target, {.label_smoothing = 0.1});
  loss.backward();
  const double norm = optim::clip_grad_norm_(reference->parameters(), 0.05).item<double>();
  EXPECT_GT(norm, 0.05);  // the clip did something
  sgd_ref->step();
  expect_close(flat_parameters(*model), flat_parameters(*reference), 0.0f);
  EXPECT_NE(flat_parameters(*model), flat_parameters(*unclipped));
}

TEST(Trainer, CudaGraphsRefusalSaysWhy) {
  TrainOptions o;
  EXPECT_EQ(cuda_graphs_refusal(o, cuda_device(0), 1), "");
  EXPECT_NE(cuda_graphs_refusal(o, kCPU, 1).find("CUDA device"), std::string::npos);
  EXPECT_NE(cuda_graphs_refusal(o, cuda_device(0), 4).find("DDP"), std::string::npos);
  o.accum_steps = 2;
  EXPECT_NE(cuda_graphs_refusal(o, cuda_device(0), 1).find("--accum-steps"), std::string::npos);
}

// fp16 on a multi-tensor optimizer: the scaler's check, unscale and skip happen inside the
// optimizer's pass and nothing is read back; a batch whose loss is inf still leaves the
// parameters alone, backs the scale off and counts as skipped (read when asked for), and the
// run ends where the per-parameter path's does.
TEST(Trainer, Fp16OnTheFusedPathSkipsOnTheDevice) {
  dist::SingleProcessGroup group;
  TrainOptions o;
  auto model_a = small_model(), model_b = small_model();
  auto make = [](nn::Module& m, bool foreach) {
    return std::make_unique<optim::SGD>(
        m.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .foreach = foreach});
  };
  auto fused = make(*model_a, true), per_param = make(*model_b, false);
  PrecisionContext fp16_a(Precision::kFP16, kCPU), fp16_b(Precision::kFP16, kCPU);
  Trainer a(o, *model_a, *model_a, *fused, nullptr, group, kCPU);
  Trainer b(o, *model_b, *model_b, *per_param, nullptr, group, kCPU);
  a.set_precision(&fp16_a);
  b.set_precision(&fp16_b);
  for (uint64_t step = 0; step < 6; ++step) {
    data::Batch batch = random_batch(16, 40 + step);
    if (step == 3) batch.data.narrow(0, 2, 1).fill_(std::numeric_limits<float>::infinity());
    const auto before = flat_parameters(*model_a);
    a.run_batch(batch);
    b.run_batch(batch);
    if (step == 3) {
      EXPECT_EQ(flat_parameters(*model_a), before);
    }
    EXPECT_EQ(fused->device_step_refusal(), "") << "step " << step;  // momentum exists
  }
  EXPECT_EQ(fp16_a.skipped_steps(), 1);
  EXPECT_EQ(fp16_a.loss_scale(), 32768.0);
  EXPECT_EQ(flat_parameters(*model_a), flat_parameters(*model_b));
}

TEST(Trainer, CudaGraphsOnTheCpuSayWhyOnceAndRunEagerly) {
  dist::SingleProcessGroup group;
  TrainOptions graphs, eager;
  graphs.cuda_graphs = true;
  auto model_a = small_model(), model_b = small_model();
  auto sgd_a = make_sgd(*model_a), sgd_b = make_sgd(*model_b);
  Trainer a(graphs, *model_a, *model_a, *sgd_a, nullptr, group, kCPU);
  Trainer b(eager, *model_b, *model_b, *sgd_b, nullptr, group, kCPU);
  ::testing::internal::CaptureStdout();
  for (uint64_t step = 0; step < Trainer::kGraphWarmupSteps + 2; ++step) {
    const data::Batch batch = random_batch(16, 200 + step);
    EXPECT_EQ(a.run_batch(batch).loss_value(), b.run_batch(batch).loss_value());
  }
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, "ember-train: --cuda-graphs: CUDA graphs need a CUDA device; running eagerly\n");
  EXPECT_FALSE(a.replaying_cuda_graph());
  EXPECT_EQ(flat_parameters(*model_a), flat_parameters(*model_b));
}

// On a GPU, 20 steps replayed from a captured graph (after the eager warm-up) leave the same
// parameters as 20 eager steps: an MLP, and a small ResNet (convolutions, batch norm and its
// running statistics, the fused batch norm + ReLU ops) in channels_last; the whole step is in
// the graph (clipping and the optimizer too: SGD with Nesterov momentum, and AdamW), the lr
// changes every step (a schedule the host steps between replays), and an fp16 run's
// GradScaler checks, unscales, skips and updates its scale inside the graph as well.
TEST(Trainer, CudaGraphReplayEqualsEagerOverTwentySteps) {
  EMBER_REQUIRE_CUDA();
  dist::SingleProcessGroup group;
  const Device gpu = cuda_device(0);
  TrainOptions graphs, eager;
  graphs.cuda_graphs = true;
  graphs.grad_clip = eager.grad_clip = 2.0;
  auto image_batch = [](uint64_t seed) {
    manual_seed(seed);
    data::Batch b;
    b.data = randn({16, 3, 8, 8});
    b.target = randint(0, 3, {16});
    return b;
  };
  auto resnet = [gpu] {
    manual_seed(9);
    auto m = std::make_shared<nn::ResNet>(std::vector<int64_t>{4, 8}, std::vector<int64_t>{1, 1}, 3,
                                          3, nn::Stem::kCifar);
    m->to(gpu);
    m->to(MemoryFormat::ChannelsLast);
    return std::shared_ptr<nn::Module>(m);
  };
  auto mlp = [gpu] {
    auto m = small_model();
    m->to(gpu);
    return m;
  };
  struct Case {
    const char* name;
    std::function<std::shared_ptr<nn::Module>()> make;
    std::function<data::Batch(uint64_t)> batch;
  };
  auto adamw = [](nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<optim::AdamW>(m.parameters(),
                                          optim::AdamWOptions{.lr = 3e-3, .weight_decay = 0.05});
  };
  auto sgd = [](nn::Module& m) -> std::unique_ptr<optim::Optimizer> { return make_sgd(m); };
  struct Run {
    const char* name;
    std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)> optimizer;
    Precision precision;
  };
  for (const Case& c : {Case{"mlp", mlp, [](uint64_t seed) { return random_batch(16, seed); }},
                        Case{"resnet", resnet, image_batch}}) {
    for (const Run& run :
         {Run{"sgd", sgd, Precision::kFP32}, Run{"adamw", adamw, Precision::kFP32},
          Run{"sgd fp16", sgd, Precision::kFP16}, Run{"adamw fp16", adamw, Precision::kFP16}}) {
      SCOPED_TRACE(std::string(c.name) + " " + run.name);
      auto model_a = c.make(), model_b = c.make();
      auto opt_a = run.optimizer(*model_a), opt_b = run.optimizer(*model_b);
      optim::StepLR schedule_a(*opt_a, 1, 0.93), schedule_b(*opt_b, 1, 0.93);
      PrecisionContext precision_a(run.precision, gpu), precision_b(run.precision, gpu);
      Trainer a(graphs, *model_a, *model_a, *opt_a, &schedule_a, group, gpu);
      Trainer b(eager, *model_b, *model_b, *opt_b, &schedule_b, group, gpu);
      a.set_precision(&precision_a);
      b.set_precision(&precision_b);
      for (uint64_t step = 0; step < 20; ++step) {
        const data::Batch batch = c.batch(300 + step);
        EXPECT_NEAR(a.run_batch(batch).loss_value(), b.run_batch(batch).loss_value(), 2e-3);
      }
      EXPECT_TRUE(a.replaying_cuda_graph());
      EXPECT_TRUE(opt_a->capturable());
      EXPECT_EQ(precision_a.skipped_steps(), precision_b.skipped_steps());
      EXPECT_EQ(precision_a.loss_scale(), precision_b.loss_scale());
      const double tolerance = run.precision == Precision::kFP16 ? 2e-3 : 1e-4;
      const auto sa = model_a->state_dict(), sb = model_b->state_dict();
      for (size_t i = 0; i < sa.size(); ++i) {
        SCOPED_TRACE(sa[i].first);
        EXPECT_TRUE(allclose(sa[i].second.cpu().to(kF64), sb[i].second.cpu().to(kF64), tolerance,
                             tolerance / 10));
      }
    }
  }
}

TEST(Trainer, NoDecayGroupsHoldNormsAndBiases) {
  auto resnet = nn::resnet("resnet20", 10, 3);
  const auto groups = parameter_groups(*resnet, true);
  ASSERT_EQ(groups.size(), 2u);
  size_t matrices = 0, vectors = 0;
  for (const auto& [name, p] : resnet->named_parameters()) {
    const bool is_vector = name.find("bn") != std::string::npos ||
                           name.find("bias") != std::string::npos ||
                           name.find("downsample.1") != std::string::npos;
    EXPECT_EQ(p.dim() <= 1, is_vector) << name;
    (p.dim() <= 1 ? vectors : matrices) += 1;
  }
  EXPECT_EQ(groups[0].params.size(), matrices);
  EXPECT_EQ(groups[1].params.size(), vectors);
  optim::SGD sgd(groups, {.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4});
  EXPECT_EQ(sgd.param_groups()[0].option("weight_decay"), 5e-4);
  EXPECT_EQ(sgd.param_groups()[1].option("weight_decay"), 0.0);
  EXPECT_EQ(parameter_groups(*resnet, false).size(), 1u);
}

// Counts metrics.jsonl lines of a kind.
int64_t count_records(const fs::path& jsonl, const std::string& kind) {
  std::ifstream in(jsonl);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);)
    n += line.find("\"kind\": \"" + kind + "\"") != std::string::npos;
  return n;
}

struct EpochFixture {
  dist::SingleProcessGroup group;
  std::shared_ptr<data::Dataset> train, test;
  std::unique_ptr<data::DataLoader> train_loader, test_loader;
  fs::path dir;
  explicit EpochFixture(const std::string& name) {
    manual_seed(3);
    train = std::make_shared<data::TensorDataset>(randn({100, 8}), randint(0, 3, {100}));
    test = std::make_shared<data::TensorDataset>(randn({20, 8}), randint(0, 3, {20}));
    data::DataLoaderOptions lo;
    lo.batch_size = 4;
    lo.shuffle = true;
    lo.drop_last = true;
    train_loader = std::make_unique<data::DataLoader>(train, lo);
    lo.shuffle = false;
    test_loader = std::make_unique<data::DataLoader>(test, lo);
    dir = fs::temp_directory_path() / ("ember_apps_" + name + "_" + std::to_string(getpid()));
    fs::remove_all(dir);
  }
  ~EpochFixture() { fs::remove_all(dir); }
  // A trainer of small_model() on these loaders, writing its metrics to dir.
  Trainer& trainer(const TrainOptions& options) {
    model = small_model();
    sgd = make_sgd(*model);
    metrics = std::make_unique<MetricsLog>(dir, true, false);
    trainer_ = std::make_unique<Trainer>(options, *model, *model, *sgd, nullptr, group, kCPU);
    trainer_->attach(*train_loader, *test_loader, nullptr, *metrics, progress);
    return *trainer_;
  }
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::SGD> sgd;
  std::unique_ptr<MetricsLog> metrics;
  Progress progress{false, 50};
  std::unique_ptr<Trainer> trainer_;
};

TEST(Trainer, EpochsWriteStepEvalAndEpochRecords) {
  EpochFixture f("records");
  TrainOptions o;
  o.epochs = 2;
  o.log_every = 10;
  o.eval_every_steps = 10;
  Trainer& trainer = f.trainer(o);
  const MetricsLog& metrics = *f.metrics;
  EXPECT_EQ(trainer.steps_per_epoch(), 25);
  trainer.train(0);
  EXPECT_EQ(trainer.step(), 50);
  // Steps 10, 20, 25 (epoch end), 30, 40, 50.
  EXPECT_EQ(count_records(metrics.jsonl_path(), "step"), 6);
  // Evaluations at 10, 20 and each epoch's end (25, 50), and 30, 40.
  EXPECT_EQ(count_records(metrics.jsonl_path(), "eval"), 6);
  EXPECT_EQ(count_records(metrics.jsonl_path(), "epoch"), 2);
  const std::string png = f.metrics->plot(trainer.steps_per_epoch(), trainer.step());
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    ASSERT_FALSE(png.empty());
    EXPECT_GT(fs::file_size(png), 1000u);
  }
}

// The text of `key`'s value in each metrics.jsonl record of a kind.
std::vector<std::string> record_values(const fs::path& jsonl, const std::string& kind,
                                       const std::string& key) {
  std::ifstream in(jsonl);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"kind\": \"" + kind + "\"") == std::string::npos) continue;
    const size_t at = line.find("\"" + key + "\": ");
    if (at == std::string::npos) continue;
    const size_t begin = at + key.size() + 4;
    out.push_back(line.substr(begin, line.find_first_of(",}", begin) - begin));
  }
  return out;
}

std::string fixed5(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.5f", v);
  return text;
}

TEST(Trainer, MetricsFromDeviceSumsEqualHostSums) {
  // run_epoch keeps its sums on the device and reads them back at records only; the records
  // must be those of summing each step's loss and right answers on the host.
  EpochFixture f("device_sums");
  TrainOptions o;
  o.epochs = 1;
  o.log_every = 10;
  f.trainer(o).train(0);
  auto model = small_model();
  auto sgd = make_sgd(*model);
  Trainer reference(o, *model, *model, *sgd, nullptr, f.group, kCPU);
  f.train_loader->set_epoch(0);
  double window = 0, loss_sum = 0, correct = 0, seen = 0;
  int64_t steps = 0, in_window = 0;
  std::vector<std::string> expected;
  for (const data::Batch& batch : *f.train_loader) {
    const BatchResult r = reference.run_batch(batch);
    window += r.loss_value();
    loss_sum += r.loss_value() * static_cast<double>(r.count);
    correct += r.correct_value();
    seen += static_cast<double>(r.count);
    ++in_window;
    if (++steps % 10 == 0 || steps == 25) {
      expected.push_back(fixed5(window / static_cast<double>(in_window)));
      window = 0;
      in_window = 0;
    }
  }
  const fs::path jsonl = f.metrics->jsonl_path();
  EXPECT_EQ(record_values(jsonl, "step", "loss"), expected);
  EXPECT_EQ(record_values(jsonl, "epoch", "train_loss"),
            std::vector<std::string>{fixed5(loss_sum / seen)});
  EXPECT_EQ(record_values(jsonl, "epoch", "train_accuracy"),
            std::vector<std::string>{fixed5(correct / seen)});
}

TEST(Trainer, DefaultLogEveryGivesFiftyPointsAnEpochAndMaxStepsStops) {
  EpochFixture f("default");
  TrainOptions o;
  o.epochs = 3;
  o.max_steps = 30;
  Trainer& trainer = f.trainer(o);
  const MetricsLog& metrics = *f.metrics;
  EXPECT_EQ(trainer.log_every(), 1);   // 25 steps an epoch: every step
  EXPECT_EQ(trainer.eval_every(), 0);  // a --max-steps run: each epoch's end only
  trainer.train(0);
  EXPECT_EQ(trainer.step(), 30);
  EXPECT_EQ(count_records(metrics.jsonl_path(), "step"), 30);
  EXPECT_EQ(count_records(metrics.jsonl_path(), "epoch"), 2);
  EXPECT_EQ(count_records(metrics.jsonl_path(), "eval"), 2);
  o.log_every = 0;
  o.max_steps = 0;
  // 468 steps an epoch (Fashion-MNIST, batch 128): every 9th, 52 records.
  data::DataLoaderOptions lo;
  lo.batch_size = 1;
  data::DataLoader big(std::make_shared<data::TensorDataset>(zeros({468, 1}), zeros({468}, kI64)),
                       lo);
  Trainer sized(o, *f.model, *f.model, *f.sgd, nullptr, f.group, kCPU);
  sized.attach(big, *f.test_loader, nullptr, *f.metrics, f.progress);
  EXPECT_EQ(sized.log_every(), 9);
  EXPECT_GE(468 / sized.log_every(), 50);
}

TEST(Trainer, ShortRunsAreEvaluatedEveryQuarter) {
  EpochFixture f("quarters");
  TrainOptions o;
  o.epochs = 2;
  Trainer& trainer = f.trainer(o);
  EXPECT_EQ(trainer.eval_every(), 12);  // 50 steps in all
  trainer.train(0);
  // Steps 12, 24, 25 (epoch end), 36, 48, 50 (epoch end).
  EXPECT_EQ(count_records(f.metrics->jsonl_path(), "eval"), 6);
  o.epochs = 4;
  EXPECT_EQ(f.trainer(o).eval_every(), 0);  // each epoch's end is enough
}

// The tutorial's Trainer as a library: the model, optimizer, schedule, sampler and RNG in a
// dist::Checkpoint, snapshots every 3 steps, and a fresh trainer that loads one mid-epoch.
struct SnapshotRun {
  dist::SingleProcessGroup group;
  std::shared_ptr<dist::DistributedSampler> sampler;
  std::unique_ptr<data::DataLoader> train_loader, test_loader;
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::SGD> sgd;
  std::unique_ptr<optim::StepLR> schedule;
  dist::Checkpoint checkpoint;
  MetricsLog metrics;
  Progress progress{false, 50};
  std::unique_ptr<Trainer> trainer;
  SnapshotRun(const TrainOptions& options, const fs::path& dir) : metrics(dir, false, false) {
    manual_seed(3);
    auto train = std::make_shared<data::TensorDataset>(randn({40, 8}), randint(0, 3, {40}));
    auto test = std::make_shared<data::TensorDataset>(randn({8, 8}), randint(0, 3, {8}));
    sampler = std::make_shared<dist::DistributedSampler>(
        40, group, dist::DistributedSamplerOptions{.seed = 5});
    train_loader = std::make_unique<data::DataLoader>(
        train, data::DataLoaderOptions{.batch_size = 4, .drop_last = true, .sampler = sampler});
    test_loader =
        std::make_unique<data::DataLoader>(test, data::DataLoaderOptions{.batch_size = 4});
    model = small_model();
    sgd = make_sgd(*model);
    schedule = std::make_unique<optim::StepLR>(*sgd, 7, 0.5);
    checkpoint = {.model = model.get(),
                  .optimizer = sgd.get(),
                  .scheduler = schedule.get(),
                  .generators = {{"default", &default_generator()}},
                  .sampler = sampler.get()};
    trainer = std::make_unique<Trainer>(options, *model, *model, *sgd, schedule.get(), group, kCPU);
    trainer->attach(*train_loader, *test_loader, &checkpoint, metrics, progress);
  }
};

TEST(Trainer, LoadSnapshotContinuesMidEpochExactly) {
  const fs::path dir =
      fs::temp_directory_path() / ("ember_apps_trainer_" + std::to_string(getpid()));
  fs::remove_all(dir);
  TrainOptions o;
  o.epochs = 2;
  o.checkpoint_dir = dir.string();
  o.save_every_steps = 3;
  SnapshotRun straight(o, dir);
  straight.trainer->train(0);
  EXPECT_EQ(straight.trainer->step(), 20);  // 10 steps an epoch
  // Newest first: the epoch ends (10, 20) and every third step between.
  std::vector<int64_t> steps;
  for (const SnapshotFile& f : list_snapshots(dir.string())) steps.push_back(f.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{20, 18, 15, 12, 10, 9, 6, 3}));

  SnapshotRun resumed(o, dir);
  EXPECT_EQ(resumed.trainer->load_snapshot((dir / "checkpoint-step-15.safetensors").string()), 1);
  EXPECT_EQ(resumed.trainer->step(), 15);
  EXPECT_EQ(resumed.sampler->position(), 20);  // 5 batches of 4 into epoch 2
  resumed.trainer->train(1);
  EXPECT_EQ(resumed.trainer->step(), 20);
  EXPECT_EQ(flat_parameters(*resumed.model), flat_parameters(*straight.model));
  // The comparison can fail: a trainer that restarts epoch 2 from its first batch differs.
  SnapshotRun restarted(o, dir);
  restarted.trainer->load_snapshot((dir / "checkpoint-step-15.safetensors").string());
  restarted.sampler->set_position(0);
  restarted.trainer->train(1);
  EXPECT_NE(flat_parameters(*restarted.model), flat_parameters(*straight.model));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ember::apps

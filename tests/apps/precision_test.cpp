// ember-train's --precision: the modes, the Trainer under autocast and loss scaling, and what
// the metrics record.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <ember/dist/single_process_group.h>
#include <ember/ember.h>

#include "precision.h"
#include "small_model.h"
#include "trainer.h"

namespace fs = std::filesystem;

namespace ember::apps {
namespace {

using testing::flat_parameters;
using testing::make_sgd;
using testing::random_batch;
using testing::small_model;

TEST(Precision, ModesAndTheirDefaults) {
  EXPECT_EQ(resolve_precision("auto", kCPU), Precision::kFP32);
  EXPECT_EQ(resolve_precision("fp32", kCPU), Precision::kFP32);
  EXPECT_EQ(resolve_precision("tf32", kCPU), Precision::kTF32);
  EXPECT_EQ(resolve_precision("bf16", kCPU), Precision::kBF16);
  EXPECT_EQ(resolve_precision("fp16", kCPU), Precision::kFP16);
  if (cuda::is_available()) {
    EXPECT_EQ(resolve_precision("auto", cuda_device(0)),
              cuda::device_capability(0).first >= 8 ? Precision::kBF16 : Precision::kFP32);
  }
  try {
    resolve_precision("fp8", kCPU);
    ADD_FAILURE() << "fp8 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown precision \"fp8\""), std::string::npos)
        << e.what();
  }
  EXPECT_STREQ(precision_name(Precision::kBF16), "bf16");
}

TEST(Precision, Fp32AndTf32SetTheTf32PolicyForTheRunOnly) {
  {
    PrecisionContext tf32(Precision::kTF32, kCPU);
    EXPECT_EQ(get_float32_matmul_precision(), "high");
    EXPECT_TRUE(cudnn_allow_tf32());
    EXPECT_EQ(tf32.autocast(), nullptr);
    EXPECT_EQ(tf32.scaler(), nullptr);
  }
  {
    PrecisionContext fp32(Precision::kFP32, kCPU);
    EXPECT_EQ(get_float32_matmul_precision(), "highest");
    EXPECT_FALSE(cudnn_allow_tf32());
  }
  EXPECT_EQ(get_float32_matmul_precision(), "highest");  // PyTorch's defaults again
  EXPECT_TRUE(cudnn_allow_tf32());
}

// bf16 autocast on the CPU: the step runs, weights and gradients stay f32, and the loss
// tracks the f32 run's within bf16's rounding (8 bits: a few parts in a thousand per op).
TEST(Precision, Bf16TrainerStepsKeepF32WeightsAndTrackF32) {
  dist::SingleProcessGroup group;
  TrainOptions o;
  auto model = small_model(), reference = small_model();
  auto sgd = make_sgd(*model), sgd_ref = make_sgd(*reference);
  PrecisionContext bf16(Precision::kBF16, kCPU);
  Trainer trainer(o, *model, *model, *sgd, nullptr, group, kCPU);
  trainer.set_precision(&bf16);
  Trainer f32(o, *reference, *reference, *sgd_ref, nullptr, group, kCPU);
  for (uint64_t step = 0; step < 5; ++step) {
    const data::Batch batch = random_batch(16, 30 + step);
    const BatchResult r = trainer.run_batch(batch), ref = f32.run_batch(batch);
    EXPECT_NEAR(r.loss_value(), ref.loss_value(), 2e-2 * ref.loss_value()) << "step " << step;
  }
  for (const Tensor& p : model->parameters()) {
    EXPECT_EQ(p.dtype(), kF32);
    EXPECT_EQ(p.grad().dtype(), kF32);
  }
  const auto a = flat_parameters(*model), b = flat_parameters(*reference);
  double most = 0;
  for (size_t i = 0; i < a.size(); ++i) most = std::max(most, std::abs(double(a[i]) - b[i]));
  EXPECT_LT(most, 2e-2);
  EXPECT_GT(most, 0.0) << "bf16 autocast changed nothing: was it on?";
  EXPECT_EQ(bf16.skipped_steps(), 0);
}

// fp16 + scaler: a batch whose loss is inf skips the step (parameters unchanged) and halves
// the scale; the clean steps around it run. Clipping sees unscaled gradients.
TEST(Precision, Fp16SkipsInfStepsAndBacksOffTheScale) {
  dist::SingleProcessGroup group;
  TrainOptions o;
  o.grad_clip = 1.0;
  auto model = small_model();
  auto sgd = make_sgd(*model);
  PrecisionContext fp16(Precision::kFP16, kCPU);
  ASSERT_NE(fp16.scaler(), nullptr);
  EXPECT_EQ(fp16.loss_scale(), 65536.0);
  Trainer trainer(o, *model, *model, *sgd, nullptr, group, kCPU);
  trainer.set_precision(&fp16);
  trainer.run_batch(random_batch(16, 1));
  const auto before = flat_parameters(*model);
  data::Batch bad = random_batch(16, 2);
  bad.data.narrow(0, 3, 1).fill_(std::numeric_limits<float>::infinity());
  trainer.run_batch(bad);
  EXPECT_EQ(flat_parameters(*model), before);
  EXPECT_EQ(fp16.skipped_steps(), 1);
  EXPECT_EQ(fp16.loss_scale(), 32768.0);
  trainer.run_batch(random_batch(16, 3));
  EXPECT_NE(flat_parameters(*model), before);
  EXPECT_EQ(fp16.skipped_steps(), 1);
  EXPECT_EQ(trainer.step(), 3);
  for (const Tensor& p : model->parameters()) EXPECT_EQ(p.grad().dtype(), kF32);
}

TEST(Precision, MetricsRecordPrecisionScaleAndSkips) {
  const fs::path dir = fs::temp_directory_path() / ("ember_precision_" + std::to_string(getpid()));
  fs::remove_all(dir);
  PrecisionContext fp16(Precision::kFP16, kCPU), bf16(Precision::kBF16, kCPU);
  {
    MetricsLog log(dir / "fp16", true, false);
    log.set_precision(&fp16);
    log.step(1, 0.5, 2.0, 0.1, 100.0);
    log.epoch(2, 1, 2.0, 0.5, 2.1, 0.4, 100.0, 0.1, 1.0, 1.0);
  }
  {
    MetricsLog log(dir / "bf16", true, false);
    log.set_precision(&bf16);
    log.step(1, 0.5, 2.0, 0.1, 100.0);
  }
  auto lines = [](const fs::path& path) {
    std::ifstream in(path);
    std::vector<std::string> out;
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  const auto f = lines(dir / "fp16" / "metrics.jsonl");
  ASSERT_EQ(f.size(), 2u);
  for (const std::string& line : f) {
    EXPECT_NE(line.find("\"precision\": \"fp16\", \"skipped_steps\": 0, \"loss_scale\": 65536}"),
              std::string::npos)
        << line;
  }
  const auto b = lines(dir / "bf16" / "metrics.jsonl");
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NE(b[0].find("\"precision\": \"bf16\", \"skipped_steps\": 0}"), std::string::npos) << b[0];
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ember::apps

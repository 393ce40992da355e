// ember-train resumed on another number of ranks: a 2-rank run's snapshot taken mid-epoch,
// continued on 4 ranks and on 1 with --global-batch-size and --sync-bn, ends at the
// uninterrupted 2-rank run's parameters to f64 rounding (--dtype f64); without a fixed global batch
// the resize is said and the schedule follows the new global batch; a snapshot of another model is
// refused by name.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>

#include <ember/dist/checkpoint.h>
#include <ember/ember.h>

#include "test_util.h"
#include "train_cli.h"

namespace fs = std::filesystem;

namespace ember::apps {
namespace {

using testing::Result;
using testing::run;

// The parameters and buffers of two snapshots: the largest difference, each tensor's scaled by
// the largest magnitude of the first one's (rounding, not training, must explain it).
double largest_relative_difference(const fs::path& a, const fs::path& b) {
  const dist::CheckpointFile fa = dist::read_checkpoint(a.string());
  const dist::CheckpointFile fb = dist::read_checkpoint(b.string());
  double worst = 0;
  int compared = 0;
  for (const auto& [name, ta] : fa.tensors) {
    if (name.rfind("model.", 0) != 0) continue;
    EXPECT_TRUE(fb.tensors.count(name)) << name;
    if (fb.tensors.count(name) == 0) continue;
    const Tensor x = ta.to(kF64), y = fb.tensors.at(name).to(kF64);
    EXPECT_EQ(x.sizes(), y.sizes()) << name;
    const double scale = std::max(max(abs(x)).item<double>(), 1e-3);
    worst = std::max(worst, max(abs(x - y)).item<double>() / scale);
    ++compared;
  }
  EXPECT_GT(compared, 20);
  return worst;
}

// 40 training images, 2 epochs of 5 steps at a global batch of 8 (4 on each of 2 ranks, 2 on
// each of 4, 8 on 1), ResNet-20 with SyncBatchNorm, a snapshot every 3 steps: the one of step 3
// has read 24 of epoch 1's 40 images.
class Resize : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("ember_apps_resize_" + std::to_string(getpid()));
    fs::remove_all(root_);
    ASSERT_TRUE(testing::make_image_folder(root_ / "data", 20, 4));
    const Result r = run(launch(2) + args(root_ / "reference", "--global-batch-size 8"));
    ASSERT_EQ(r.code, 0) << r.output;
    ASSERT_NE(r.output.find(" 2 rank(s) on cpu (tcp)"), std::string::npos) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static std::string launch(int ranks) {
    return "TORCHRUN_STYLE_TIMEOUT=100 bash " + std::string(EMBER_TORCHRUN_STYLE) + " " +
           std::to_string(ranks) + " " + EMBER_TRAIN_BIN;
  }
  static std::string args(const fs::path& out, const std::string& batch) {
    return " --dataset folder --data " + (root_ / "data").string() +
           " --image-size 16 --mean 0.5 0.5 0.5 --std 0.25 0.25 0.25 --epochs 2 --sync-bn "
           "--dtype f64 --workers 0 --threads 1 --device cpu --deterministic --log-every 1 "
           "--save-every-steps 3 --out-dir " +
           out.string() + " " + batch + " ";
  }
  // `name` (out_name/) holding the reference run's snapshot of step 3 alone.
  static fs::path with_step3(const std::string& name) {
    const fs::path out = root_ / name;
    fs::remove_all(out);
    fs::create_directories(out);
    fs::copy_file(root_ / "reference" / kStep3, out / kStep3);
    return out;
  }
  static fs::path final_of(const fs::path& out) { return out / "checkpoint-epoch-2.safetensors"; }

  static constexpr const char* kStep3 = "checkpoint-step-3.safetensors";
  static fs::path root_;
};
fs::path Resize::root_;

// The ranks sum their gradients and SyncBatchNorm its statistics in another grouping, so the
// runs agree to rounding, not bit for bit: in f64 about 4e-15 of each tensor's scale. (In f32
// a ReLU input within rounding of 0 can flip, so a run can part from the other by a whole
// activation's gradient: f64 makes that vanishingly rare.)
constexpr double kTolerance = 1e-12;

TEST_F(Resize, TwoRanksResumedOnFourAndOnOneEqualTheUninterruptedRun) {
  for (const int ranks : {4, 1}) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
    const fs::path out = with_step3("on" + std::to_string(ranks));
    const Result r = run(launch(ranks) + args(out, "--global-batch-size 8") + "--resume auto");
    ASSERT_EQ(r.code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from " + (out / kStep3).string() + " at step 3"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("resized: the snapshot was taken on 2 rank(s) with a global batch "
                            "of 8; this run has " +
                            std::to_string(ranks) + " rank(s) with a global batch of 8 (" +
                            std::to_string(8 / ranks) + " per rank)"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("the step counter (3) and the learning-rate schedule continue"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("done: 10 steps"), std::string::npos) << r.output;
    const double difference =
        largest_relative_difference(final_of(root_ / "reference"), final_of(out));
    EXPECT_LT(difference, kTolerance);
    std::printf("resumed on %d rank(s): largest relative difference %.3g\n", ranks, difference);
  }
  EXPECT_EQ(dist::read_checkpoint(final_of(root_ / "reference").string())
                .tensors.at("model.fc.weight")
                .dtype(),
            kF64);
  // The comparison can fail: the snapshot of step 3 is not the end.
  EXPECT_GT(
      largest_relative_difference(root_ / "reference" / kStep3, final_of(root_ / "reference")),
      100 * kTolerance);
}

TEST_F(Resize, WithoutAFixedGlobalBatchTheResizeIsSaidAndTheScheduleFollows) {
  // 1 rank of 4: a global batch of 4 where the snapshot's was 8. The 16 images left of epoch 1
  // are 4 steps; the schedule of this run (10 steps per epoch) continues at its step 6.
  const fs::path out = with_step3("batch4");
  const Result r = run(launch(1) + args(out, "--batch-size 4") + "--resume auto");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("resized: the snapshot was taken on 2 rank(s) with a global batch of "
                          "8; this run has 1 rank(s) with a global batch of 4 (4 per rank)"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("The learning rate follows the new global batch"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("continues at its step 6"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Pass --global-batch-size 8"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("done: 17 steps"), std::string::npos) << r.output;  // 3 + 4 + 10
}

TEST_F(Resize, SnapshotOfAnotherModelIsRefusedByName) {
  const fs::path out = with_step3("other_model");
  const Result r =
      run(launch(1) + args(out, "--global-batch-size 8") + "--model resnet32 --resume auto");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Trainer::resume: " + (out / kStep3).string() +
                          " is a snapshot of --model resnet20 and this run trains --model "
                          "resnet32"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("starting from scratch"), std::string::npos) << r.output;
}

TEST_F(Resize, MaxStepsWithAnotherGlobalBatchIsRefusedBeforeAnythingLoads) {
  const fs::path out = with_step3("max_steps");
  const Result r = run(launch(1) + args(out, "--batch-size 4") + "--max-steps 6 --resume auto");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("Trainer::resume: " + (out / kStep3).string() +
                          ": the snapshot's global batch is 8 and this run's 4: --max-steps"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("starting from scratch"), std::string::npos) << r.output;
}

TEST(GlobalBatchSize, DividesAmongTheRanksOrIsRefused) {
  TrainOptions o;
  ASSERT_EQ(testing::parse_args({"--global-batch-size", "24", "--accum-steps", "2"}, o), -1);
  EXPECT_EQ(per_rank_batch(o, 1), 24);
  EXPECT_EQ(per_rank_batch(o, 3), 8);
  EXPECT_EMBER_ERROR(per_rank_batch(o, 5),
                     "--global-batch-size 24 does not divide among 5 ranks; give a multiple of 5");
  EXPECT_EMBER_ERROR(per_rank_batch(o, 8),
                     "gives 3 per rank on 8 ranks, which does not split into --accum-steps 2");
  TrainOptions plain;
  ASSERT_EQ(testing::parse_args({"--batch-size", "16"}, plain), -1);
  EXPECT_EQ(per_rank_batch(plain, 4), 16);
  TrainOptions both;
  EXPECT_NE(testing::parse_args({"--batch-size", "16", "--global-batch-size", "32"}, both), -1);
}

TEST(DtypeFlag, F64RunsInFp32PrecisionOnly) {
  TrainOptions o;
  ASSERT_EQ(testing::parse_args({"--dtype", "f64"}, o), -1);
  EXPECT_EQ(o.dtype, "f64");
  EXPECT_EQ(o.precision, "fp32");  // no autocast or TF32 around f64
  TrainOptions mixed;
  EXPECT_EQ(testing::parse_args({"--dtype", "f64", "--precision", "bf16"}, mixed), 2);
  TrainOptions plain;
  ASSERT_EQ(testing::parse_args({}, plain), -1);
  EXPECT_EQ(plain.dtype, "f32");
}

}  // namespace
}  // namespace ember::apps

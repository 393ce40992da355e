// ember-train --dataset folder: a generated folder of PNG and BMP images in two classes
// trains for a few steps, with the normalisation measured on the training split or given.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "train_cli.h"

#include <ember/dist/checkpoint.h>

namespace fs = std::filesystem;

namespace {

using ember::apps::testing::count_lines_with;
using ember::apps::testing::Result;
using ember::apps::testing::run;

class ImageFolderTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("ember_apps_folder_" + std::to_string(getpid()));
    fs::remove_all(root_);
    ASSERT_TRUE(ember::apps::testing::make_image_folder(root_, 16, 4));
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string command(const std::string& extra) const {
    return std::string(EMBER_TRAIN_BIN) + " --dataset folder --data " + root_.string() +
           " --image-size 16 --batch-size 8 --epochs 2 --workers 0 --threads 1 --log-every 1 "
           "--out-dir " +
           (root_ / "out").string() + " " + extra;
  }
  fs::path root_;
};

TEST_F(ImageFolderTrain, TrainsAFewStepsWithMeasuredStatistics) {
  const Result r = run(command(""));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("image folder"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("2 classes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(measured on the training split)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("final test accuracy"), std::string::npos) << r.output;
  // 32 training images, batch 8: 4 steps an epoch, a record each.
  const fs::path jsonl = root_ / "out" / "metrics.jsonl";
  EXPECT_EQ(count_lines_with(jsonl, "\"kind\": \"step\""), 8);
  EXPECT_EQ(count_lines_with(jsonl, "\"kind\": \"epoch\""), 2);
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0) {
    EXPECT_GT(fs::file_size(root_ / "out" / "curves.png"), 1000u);
  }
}

// A non-image file is not a sample; an image that does not decode is named by path with the
// reason, never a crash: it ends the run (--bad-images fail, the default) or is left out and
// counted (--bad-images skip).
TEST_F(ImageFolderTrain, BadFilesAreNamedNotACrash) {
  std::ofstream(root_ / "train" / "dog" / "notes.txt") << "not an image";
  const Result ignored = run(command("--max-steps 2"));
  ASSERT_EQ(ignored.code, 0) << ignored.output;
  EXPECT_NE(ignored.output.find("32 train"), std::string::npos) << ignored.output;
  const fs::path good = root_ / "train" / "cat" / "img0.png",
                 bad = root_ / "train" / "cat" / "cut.png";
  fs::copy_file(good, bad);
  fs::resize_file(bad, 40);  // the header and part of the first chunk
  const Result failed = run(command("--max-steps 2"));
  EXPECT_EQ(failed.code, 1) << failed.output;
  EXPECT_NE(failed.output.find(bad.string()), std::string::npos) << failed.output;
  EXPECT_NE(failed.output.find("truncated"), std::string::npos) << failed.output;
  const Result skipped = run(command("--max-steps 2 --bad-images skip"));
  ASSERT_EQ(skipped.code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("32 train"), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find("left out 1 image(s)"), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find("  " + bad.string() + ": "), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find("skipped 1 image(s)"), std::string::npos) << skipped.output;
}

TEST_F(ImageFolderTrain, GivenStatisticsAndClearErrors) {
  const Result given = run(command("--max-steps 2 --mean 0.5 0.5 0.5 --std 0.25 0.25 0.25"));
  ASSERT_EQ(given.code, 0) << given.output;
  EXPECT_NE(given.output.find("mean 0.5000 0.5000 0.5000, std 0.2500"), std::string::npos)
      << given.output;
  EXPECT_EQ(given.output.find("measured"), std::string::npos) << given.output;
  const Result half = run(command("--mean 0.5 0.5 0.5"));
  EXPECT_EQ(half.code, 2);
  EXPECT_NE(half.output.find("--mean and --std together"), std::string::npos) << half.output;
  fs::remove_all(root_ / "val" / "dog");
  const Result mismatch = run(command(""));
  EXPECT_EQ(mismatch.code, 1);
  EXPECT_NE(mismatch.output.find("same class folders"), std::string::npos) << mismatch.output;
  fs::remove_all(root_ / "val");
  const Result missing = run(command(""));
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("is not a folder"), std::string::npos) << missing.output;
}

// --precision: bf16 autocast and fp16 with loss scaling run on the CPU and are recorded;
// checkpoints carry the scaler's state and load into another precision.
TEST_F(ImageFolderTrain, PrecisionIsRecordedAndCheckpointsLoadIntoAnyPrecision) {
  const fs::path jsonl = root_ / "out" / "metrics.jsonl", ckpt = root_ / "ckpt";
  const Result bf16 = run(command("--max-steps 3 --device cpu --precision bf16"));
  ASSERT_EQ(bf16.code, 0) << bf16.output;
  EXPECT_NE(bf16.output.find("precision bf16"), std::string::npos) << bf16.output;
  EXPECT_EQ(count_lines_with(jsonl, "\"precision\": \"bf16\", \"skipped_steps\": 0}"), 4);
  EXPECT_EQ(count_lines_with(jsonl, "loss_scale"), 0);

  const Result fp16 =
      run(command("--max-steps 3 --device cpu --precision fp16 --checkpoint-dir " + ckpt.string()));
  ASSERT_EQ(fp16.code, 0) << fp16.output;
  EXPECT_EQ(count_lines_with(jsonl,
                             "\"precision\": \"fp16\", \"skipped_steps\": 0, "
                             "\"loss_scale\": 65536}"),
            4);
  const ember::dist::CheckpointFile file =
      ember::dist::read_checkpoint((ckpt / "checkpoint-step-3.safetensors").string());
  ASSERT_EQ(file.metadata.count("grad_scaler.scale"), 1u);
  EXPECT_EQ(std::stod(file.metadata.at("grad_scaler.scale")), 65536.0);
  EXPECT_EQ(std::stod(file.metadata.at("grad_scaler._growth_tracker")), 3.0);
  EXPECT_EQ(file.tensors.at("model.fc.weight").dtype(), ember::kF32);

  // 4 steps an epoch: --max-steps 3 stops mid-epoch with a step snapshot. The fp16 snapshot
  // resumes in fp16 (the scaler continues: 3 + 2 clean steps) and that run's snapshot resumes
  // in bf16, which needs no scaler.
  for (const char* precision : {"fp16", "bf16"}) {
    const Result resumed =
        run(command(std::string("--max-steps 5 --device cpu --resume ") + "--precision " +
                    precision + " --checkpoint-dir " + ckpt.string()));
    ASSERT_EQ(resumed.code, 0) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from"), std::string::npos) << resumed.output;
    if (std::string(precision) == "fp16") {
      const ember::dist::CheckpointFile next =
          ember::dist::read_checkpoint((ckpt / "checkpoint-step-5.safetensors").string());
      EXPECT_EQ(std::stod(next.metadata.at("grad_scaler._growth_tracker")), 5.0);
    }
  }
  const Result unknown = run(command("--precision fp8"));
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.output.find("--precision"), std::string::npos) << unknown.output;
}

}  // namespace

// ember-train's --channels-last: the flag and its default (on for CUDA, off on the CPU), and
// a run in channels_last that trains as the NCHW run does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "train_cli.h"

namespace fs = std::filesystem;

namespace ember::apps {
namespace {

using testing::parse_args;

TEST(ChannelsLastFlag, DefaultsOnForCudaOffForCpu) {
  TrainOptions o;
  ASSERT_EQ(parse_args({}, o), -1);
  EXPECT_TRUE(use_channels_last(o, true));
  EXPECT_FALSE(use_channels_last(o, false));
  TrainOptions on;
  ASSERT_EQ(parse_args({"--channels-last"}, on), -1);
  EXPECT_TRUE(use_channels_last(on, false));
  TrainOptions off;
  ASSERT_EQ(parse_args({"--no-channels-last"}, off), -1);
  EXPECT_FALSE(use_channels_last(off, true));
}

// The loss of each step (metrics.jsonl), in order.
std::vector<double> step_losses(const fs::path& jsonl) {
  std::vector<double> losses;
  std::ifstream in(jsonl);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"kind\": \"step\"") == std::string::npos) continue;
    const size_t at = line.find("\"loss\": ");
    if (at != std::string::npos) losses.push_back(std::stod(line.substr(at + 8)));
  }
  return losses;
}

TEST(ChannelsLastFlag, TrainsLikeNchwOnTheCpu) {
  const fs::path root = fs::temp_directory_path() / ("ember_apps_cl_" + std::to_string(getpid()));
  fs::remove_all(root);
  ASSERT_TRUE(testing::make_image_folder(root, 16, 4));
  auto command = [&](const std::string& extra, const std::string& out) {
    return std::string(EMBER_TRAIN_BIN) + " --dataset folder --data " + root.string() +
           " --image-size 16 --batch-size 8 --epochs 1 --workers 0 --threads 1 --log-every 1 "
           "--device cpu --model resnet20 --out-dir " +
           (root / out).string() + " " + extra;
  };
  const testing::Result nchw = testing::run(command("", "nchw"));
  ASSERT_EQ(nchw.code, 0) << nchw.output;
  const testing::Result nhwc = testing::run(command("--channels-last", "nhwc"));
  ASSERT_EQ(nhwc.code, 0) << nhwc.output;
  EXPECT_NE(nhwc.output.find("precision fp32, channels_last"), std::string::npos) << nhwc.output;
  EXPECT_EQ(nchw.output.find("channels_last"), std::string::npos) << nchw.output;
  const std::vector<double> a = step_losses(root / "nchw" / "metrics.jsonl");
  const std::vector<double> b = step_losses(root / "nhwc" / "metrics.jsonl");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(a.size(), b.size());
  // Same data and initial weights; the convolutions sum in another order (5 digits logged).
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3) << "step " << i;
  fs::remove_all(root);
}

}  // namespace
}  // namespace ember::apps

// ember-train --model gpt: a tiny GPT trained on Debian's fortunes (the default corpus) lowers
// its validation loss below what single-character frequencies allow within 200 steps; its snapshot
// continues a prompt through `ember-train sample` with the corpus's own characters; bad options are
// named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <ember/data/text.h>

#include "train_cli.h"

namespace fs = std::filesystem;

namespace {

using ember::apps::testing::Result;
using ember::apps::testing::run;

class GptTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::is_directory(ember::data::kFortunesRoot))
      GTEST_SKIP() << "Debian's fortunes package is not installed (scripts/setup.sh installs it)";
    root_ = fs::temp_directory_path() / ("ember_apps_gpt_" + std::to_string(getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string train(const std::string& extra) const {
    return std::string(EMBER_TRAIN_BIN) +
           " --model gpt --n-layer 2 --n-head 4 --n-embd 64 --block-size 64 --dropout 0 "
           "--batch-size 16 --lr 3e-3 --warmup-steps 10 --workers 0 --threads 2 --device cpu "
           "--out-dir " +
           (root_ / "out").string() + " " + extra;
  }
  fs::path root_;
};

// The last "test loss" the run printed.
double final_test_loss(const std::string& output) {
  const std::regex pattern("final test accuracy [0-9.]+%, test loss ([0-9.]+)");
  std::smatch m;
  EXPECT_TRUE(std::regex_search(output, m, pattern)) << output;
  return m.empty() ? NAN : std::stod(m[1]);
}

TEST_F(GptTrain, LossFallsOnFortunesAndTheSnapshotSamples) {
  const Result r = run(train("--max-steps 200 --save-every-steps 200 --seed 1"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("gpt ("), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on fortunes"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", 200 steps (--max-steps), precision"), std::string::npos) << r.output;
  // 113 distinct characters: a uniform guess costs ln(113) = 4.73 nats, the validation
  // split's character frequencies alone 3.36. Measured: 2.73 after 150 steps, 2.61 after 300.
  const double loss = final_test_loss(r.output);
  EXPECT_LT(loss, 2.8) << r.output;
  // Its throughput is counted in tokens, and metrics.jsonl names it so.
  std::ifstream metrics(root_ / "out" / "metrics.jsonl");
  const std::string records((std::istreambuf_iterator<char>(metrics)),
                            std::istreambuf_iterator<char>());
  EXPECT_NE(records.find("\"tokens_per_s\": "), std::string::npos) << records;
  EXPECT_EQ(records.find("images_per_s"), std::string::npos) << records;

  const fs::path snapshot = root_ / "out" / "checkpoint-step-200.safetensors";
  ASSERT_TRUE(fs::exists(snapshot)) << r.output;
  const Result s = run(std::string(EMBER_TRAIN_BIN) + " sample --checkpoint " + snapshot.string() +
                       " --prompt 'The ' --tokens 40 --seed 3 --device cpu");
  ASSERT_EQ(s.code, 0) << s.output;
  EXPECT_EQ(s.output.rfind("The ", 0), 0u) << s.output;
  const ember::data::CharDataset corpus(ember::data::fortune_files(), 8);
  const std::string text = s.output.substr(0, s.output.size() - 1);  // the final newline
  EXPECT_EQ(corpus.vocabulary().encode(text).size(), 44u) << text;   // the prompt + 40
  // A header that lies about the model's shape is refused before a model of that shape exists.
  std::ifstream in(snapshot, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string layers = "\"texts.gpt.n_layer\":\"2\"";
  const size_t at = bytes.find(layers);
  ASSERT_NE(at, std::string::npos);
  bytes[at + layers.size() - 2] = '7';
  const fs::path forged = root_ / "forged.safetensors";
  std::ofstream(forged, std::ios::binary) << bytes;
  const Result lie = run(std::string(EMBER_TRAIN_BIN) + " sample --checkpoint " + forged.string() +
                         " --device cpu");
  EXPECT_EQ(lie.code, 1) << lie.output;
  EXPECT_NE(lie.output.find("its tensors do not hold the GPT its header describes (7 layers"),
            std::string::npos)
      << lie.output;
  // The same seed samples the same text.
  EXPECT_EQ(run(std::string(EMBER_TRAIN_BIN) + " sample --checkpoint " + snapshot.string() +
                " --prompt 'The ' --tokens 40 --seed 3 --device cpu")
                .output,
            s.output);
}

// Two ranks under DDP, started by mpirun (the ctest entry apps_gpt_mpirun_np2 sets
// EMBER_TEST_MPIRUN_NP) and by ember-run: the same job, resumed from its snapshot by the other
// launcher, continues to the same final loss.
TEST_F(GptTrain, TwoRanksUnderMpirunThenEmberRun) {
  const char* mpirun = std::getenv("EMBER_TEST_MPIRUN_NP");
  if (mpirun == nullptr || mpirun[0] == '\0') GTEST_SKIP() << "run by apps_gpt_mpirun_np2";
  const std::string small =
      " --model gpt --n-layer 1 --n-head 2 --n-embd 32 --block-size 32 --batch-size 8 "
      "--workers 0 --threads 1 --device cpu --deterministic --eval-windows 64 --out-dir " +
      (root_ / "out").string();
  const Result first = run(std::string(mpirun) + " 2 " + EMBER_TRAIN_BIN + small +
                           " --max-steps 12 --save-every-steps 6");
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("2 rank(s) on cpu (mpi)"), std::string::npos) << first.output;
  const double loss = final_test_loss(first.output);
#ifdef EMBER_RUN_BIN
  fs::remove(root_ / "out" / "checkpoint-step-12.safetensors");
  const Result resumed =
      run(std::string("timeout -k 5 150 ") + EMBER_RUN_BIN + " --nproc-per-node 2 " +
          EMBER_TRAIN_BIN + small + " --max-steps 12 --save-every-steps 6 --resume auto");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("2 rank(s) on cpu (tcp)"), std::string::npos) << resumed.output;
  EXPECT_NEAR(final_test_loss(resumed.output), loss, 1e-6) << resumed.output;
#endif
}

TEST_F(GptTrain, BadOptionsAndSnapshotsAreNamed) {
  Result r = run(std::string(EMBER_TRAIN_BIN) + " --model gpt --n-embd 30 --n-head 4");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--n-embd 30 is not a multiple of --n-head 4"), std::string::npos)
      << r.output;
  r = run(train("--dataset cifar10 --max-steps 1"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--model gpt trains on --dataset text"), std::string::npos) << r.output;
  fs::create_directories(root_);
  std::ofstream(root_ / "short.txt") << "too short";
  r = run(train("--data " + (root_ / "short.txt").string() + " --max-steps 1"));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("has 9 characters, too few for one window of block_size + 1 = 65"),
            std::string::npos)
      << r.output;
  r = run(std::string(EMBER_TRAIN_BIN) + " sample --checkpoint " + (root_ / "none").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("none"), std::string::npos) << r.output;
}

// --decay-rule: nanoGPT's rule unless minGPT's is asked for; another name, or the flag
// without --model gpt, is refused.
TEST(GptOptions, DecayRuleIsNanoGPTsUnlessMinGPTsIsAskedFor) {
  using ember::apps::testing::parse_args;
  using ember::optim::WeightDecayRule;
  ember::apps::TrainOptions nanogpt, mingpt, unknown, resnet;
  ASSERT_EQ(parse_args({"--model", "gpt"}, nanogpt), -1);
  EXPECT_EQ(ember::apps::weight_decay_rule(nanogpt), WeightDecayRule::kNanoGPT);
  ASSERT_EQ(parse_args({"--model", "gpt", "--decay-rule", "mingpt"}, mingpt), -1);
  EXPECT_EQ(ember::apps::weight_decay_rule(mingpt), WeightDecayRule::kMinGPT);
  EXPECT_GT(parse_args({"--model", "gpt", "--decay-rule", "gpt2"}, unknown), 0);
  EXPECT_EQ(parse_args({"--decay-rule", "mingpt"}, resnet), 2);
}

// A TrainOptions of one's own computes F.cross_entropy's loss (no label smoothing); ember-train
// takes 0.1 for the ResNets and 0 for a GPT unless --label-smoothing says otherwise.
TEST(TrainOptionsDefaults, LabelSmoothingIsOnlyEmberTrainsResNetRecipe) {
  using ember::apps::testing::parse_args;
  EXPECT_EQ(ember::apps::TrainOptions{}.label_smoothing, 0.0);
  ember::apps::TrainOptions resnet, resnet_given, gpt;
  ASSERT_EQ(parse_args({}, resnet), -1);
  EXPECT_EQ(resnet.label_smoothing, 0.1);
  ASSERT_EQ(parse_args({"--label-smoothing", "0"}, resnet_given), -1);
  EXPECT_EQ(resnet_given.label_smoothing, 0.0);
  ASSERT_EQ(parse_args({"--model", "gpt"}, gpt), -1);
  EXPECT_EQ(gpt.label_smoothing, 0.0);
}

}  // namespace

// DistributedSampler's state in global terms: taken on 2 ranks mid-epoch and continued on 1, 3
// and 4, every index of the epoch is read exactly once (padding and drop_last as stated in
// distributed_sampler.h); states that cannot be continued are refused by why.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ember/data/dataloader.h>
#include <ember/data/transforms.h>
#include <ember/dist/distributed_sampler.h>
#include <ember/dist/window_sampler.h>
#include <ember/ember.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

// 2 ranks read 5 batches of 5: 50 of 79 consumed, a count that does not divide among 3 or 4
// ranks; the 29 left pad to 30 on 3 ranks and to 32 on 4.
constexpr int64_t kSize = 79, kBatch = 5, kSteps = 5, kConsumed = 2 * kSteps * kBatch;
constexpr uint64_t kEpoch = 3;

// How often each index of 0..size-1 occurs in `reads`.
std::vector<int> counts(const std::vector<int64_t>& reads, int64_t size) {
  std::vector<int> out(static_cast<size_t>(size), 0);
  for (int64_t i : reads) ++out.at(static_cast<size_t>(i));
  return out;
}

// 2 ranks read kSteps batches of kBatch; the state (through its strings, as a checkpoint keeps
// it) is continued on `world` ranks, which read the rest. Every read, in order.
std::vector<int64_t> resized_epoch(int world, DistributedSamplerOptions options,
                                   int64_t* padded = nullptr) {
  std::vector<int64_t> reads;
  std::map<std::string, std::string> saved;
  for (int rank = 0; rank < 2; ++rank) {
    DistributedSampler before(kSize, 2, rank, options);
    before.set_epoch(kEpoch);
    const std::vector<int64_t> mine = before.indices();
    reads.insert(reads.end(), mine.begin(), mine.begin() + kSteps * kBatch);
    const SamplerState s = before.state(kSteps * kBatch);
    EXPECT_EQ(s.consumed, kConsumed);
    if (rank == 0) saved = s.to_strings();
    EXPECT_EQ(s.to_strings(), saved) << "the ranks' states differ";
  }
  for (int rank = 0; rank < world; ++rank) {
    DistributedSampler after(kSize, world, rank, options);
    after.set_epoch(kEpoch + 1);  // whatever it held, the state selects its epoch
    after.load_state(after.state_from_strings(saved));
    EXPECT_EQ(after.epoch(), kEpoch);
    EXPECT_EQ(after.start() + after.position() * world, kConsumed);
    const std::vector<int64_t> rest = after.indices();
    EXPECT_EQ(static_cast<int64_t>(rest.size()), after.size());
    reads.insert(reads.end(), rest.begin(), rest.end());
    if (padded != nullptr && rank == 0) *padded = after.total_size() - kSize;
    // The next epoch starts from its beginning on the new ranks.
    after.set_epoch(kEpoch + 1);
    EXPECT_EQ(after.start(), 0);
    EXPECT_EQ(after.num_samples(), DistributedSampler(kSize, world, rank, options).num_samples());
  }
  return reads;
}

TEST(SamplerResize, TwoRanksContinuedOnOneThreeAndFourReadEveryIndexOnce) {
  for (int world : {1, 2, 3, 4}) {
    SCOPED_TRACE("continued on " + std::to_string(world) + " rank(s)");
    // No padding: exactly once.
    const auto exact = resized_epoch(world, {.seed = 5, .pad = false});
    EXPECT_EQ(counts(exact, kSize), std::vector<int>(kSize, 1));
    // Padded to a multiple of the new world: once each, plus the padding, which repeats the
    // epoch's first indices.
    int64_t padded = -1;
    const auto with_padding = resized_epoch(world, {.seed = 5}, &padded);
    EXPECT_EQ(padded, (world - (kSize - kConsumed) % world) % world);
    std::vector<int> expected(kSize, 1);
    const std::vector<int64_t> order = data::random_permutation(kSize, 5 + kEpoch, 0);
    for (int64_t i = 0; i < padded; ++i) ++expected[static_cast<size_t>(order[i])];
    EXPECT_EQ(counts(with_padding, kSize), expected);
    // drop_last: at most once; the rest's tail that does not fill a row of the new world is
    // left out.
    const auto dropped = resized_epoch(world, {.seed = 5, .drop_last = true});
    EXPECT_EQ(static_cast<int64_t>(dropped.size()),
              kConsumed + (kSize - kConsumed) / world * world);
    for (int c : counts(dropped, kSize)) EXPECT_LE(c, 1);
  }
  EXPECT_EQ(resized_epoch(4, {.seed = 5}).size(), kConsumed + 32u);
  // At the saved size the continued shard is the one the uninterrupted run reads.
  DistributedSampler whole(kSize, 2, 1, {.seed = 5});
  whole.set_epoch(kEpoch);
  DistributedSampler resumed(kSize, 2, 1, {.seed = 5});
  resumed.load_state(whole.state(kSteps * kBatch));
  const auto all = whole.indices();
  EXPECT_EQ(resumed.indices(), std::vector<int64_t>(all.begin() + kSteps * kBatch, all.end()));
}

TEST(SamplerResize, WindowSamplerContinuesTheSameDraw) {
  // 2 ranks of 5 windows read 2 each; 4 ranks read the rest: 6 windows, padded to 8 with fresh
  // draws. Together: the first 12 windows of the epoch's draw, each once.
  std::vector<int64_t> reads;
  SamplerState s;
  for (int rank = 0; rank < 2; ++rank) {
    DistributedWindowSampler before(40, 10, 2, rank, {.seed = 2});
    before.set_epoch(1);
    const auto mine = before.indices();
    reads.insert(reads.end(), mine.begin(), mine.begin() + 2);
    s = before.state(2);
  }
  EXPECT_EQ(s.order, "windows of 40");
  for (int rank = 0; rank < 4; ++rank) {
    DistributedWindowSampler after(40, 10, 4, rank, {.seed = 2});
    after.load_state(s);
    const auto rest = after.indices();
    reads.insert(reads.end(), rest.begin(), rest.end());
  }
  std::vector<int64_t> draw = data::random_window_starts(40, 12, 2, 1);
  std::sort(draw.begin(), draw.end());
  std::sort(reads.begin(), reads.end());
  EXPECT_EQ(reads, draw);
  // Too few windows for the new split is refused by why.
  // (9 windows per epoch of 10: 2 read, the 7 left padded to 9 on 3 ranks.)
  DistributedWindowSampler narrow(10, 9, 3, 0, {.seed = 2});
  EXPECT_EMBER_ERROR(narrow.load_state({.epoch = 1,
                                        .consumed = 2,
                                        .dataset_size = 9,
                                        .seed = 2,
                                        .order = "windows of 10",
                                        .world_size = 2}),
                     "continued on 3 ranks the epoch needs 11 distinct windows, but the dataset "
                     "has 10");
}

TEST(SamplerResize, StatesThatCannotContinueAreRefusedByWhy) {
  DistributedSampler saved(kSize, 2, 0, {.seed = 5});
  saved.set_epoch(1);
  const SamplerState s = saved.state(4);
  DistributedSampler other_size(kSize + 1, 3, 0, {.seed = 5});
  EXPECT_EMBER_ERROR(other_size.load_state(s),
                     "DistributedSampler::load_state: the state is of an epoch of 79 samples and "
                     "this sampler's epoch has 80");
  DistributedSampler other_seed(kSize, 3, 0, {.seed = 6});
  EXPECT_EMBER_ERROR(other_seed.load_state(s),
                     "the state's order was drawn with seed 5 and this sampler's with 6");
  DistributedSampler sequential(kSize, 3, 0, {.shuffle = false, .seed = 5});
  EXPECT_EMBER_ERROR(sequential.load_state(s),
                     "the state's order is shuffled and this sampler's is sequential");
  DistributedWindowSampler windows(100, kSize, 3, 0, {.seed = 5});
  EXPECT_NE(windows.refusal(s).find("this sampler's is windows of 100"), std::string::npos);
  SamplerState past_the_end = s;
  past_the_end.consumed = 90;
  DistributedSampler on_three(kSize, 3, 0, {.seed = 5});
  EXPECT_EMBER_ERROR(on_three.load_state(past_the_end), "consumed 90 samples of an epoch of 79");
  // Nothing changed on a refusal.
  EXPECT_EQ(on_three.epoch(), 0u);
  EXPECT_EQ(on_three.position(), 0);
  // 8 consumed on 3 ranks: the split begins at 8.
  on_three.load_state(s);
  EXPECT_EQ(on_three.start(), 8);
  EXPECT_EQ(on_three.position(), 0);
  EXPECT_EQ(on_three.num_samples(), 24);  // ceil(71 / 3)

  // The strings: a number that is not one is named; a state from ember before global states
  // (epoch and position only) is this sampler's order at this world size.
  auto strings = s.to_strings();
  EXPECT_EQ(strings.at("consumed"), "8");
  EXPECT_EQ(strings.at("position"), "4");
  strings["consumed"] = "-3";
  EXPECT_EMBER_ERROR(saved.state_from_strings(strings),
                     "the sampler state's \"consumed\" = \"-3\" is not a count");
  strings.erase("seed");
  strings["consumed"] = "8";
  EXPECT_EMBER_ERROR(saved.state_from_strings(strings), "\"seed\" = \"\" is not a 64-bit seed");
  DistributedSampler three(kSize, 3, 2, {.seed = 5});
  const SamplerState old = three.state_from_strings({{"epoch", "2"}, {"position", "4"}});
  EXPECT_EQ(old.consumed, 12);
  EXPECT_EQ(three.refusal(old), "");
  three.load_state(old);
  EXPECT_EQ(three.position(), 4);
  EXPECT_EQ(three.start(), 0);
  EXPECT_EMBER_ERROR(three.state_from_strings({{"position", "4"}}),
                     "the sampler state has no \"epoch\"");
  // Such a file taken on another world (its "rng_ranks") holds that world's position: refused.
  EXPECT_EQ(
      three.state_from_strings({{"epoch", "2"}, {"position", "4"}, {"rng_ranks", "3"}}).consumed,
      12);
  EXPECT_EMBER_ERROR(
      three.state_from_strings({{"epoch", "2"}, {"position", "4"}, {"rng_ranks", "2"}}),
      "the snapshot was taken on 2 rank(s) by an ember that kept each rank's own position, and "
      "this run has 3: resume it on 2 rank(s)");
  EXPECT_EMBER_ERROR(three.state_from_strings({{"epoch", "2"}, {"position", "999999"}}),
                     "position 999999 is past the data set's");
}

// A sample's random augmentation is a function of (seed, epoch, sample index): the same
// whichever rank or DataLoader worker reads it, before a resize or after.
TEST(SamplerResize, AugmentationDependsOnTheSampleNotOnTheRankOrWorker) {
  Generator pixels(4);
  auto images = std::make_shared<data::TensorDataset>(
      randint(0, 256, {kSize, 6, 6, 3}, kU8, &pixels), arange(kSize, kI64));
  const auto augment =
      std::make_shared<data::Compose>(std::vector<std::shared_ptr<const data::Transform>>{
          std::make_shared<data::RandomCrop>(6, 6, 2),
          std::make_shared<data::RandomHorizontalFlip>()});
  // Sample index -> its augmented image, from `sampler` read by `workers` workers.
  auto read = [&](std::shared_ptr<DistributedSampler> sampler, int workers,
                  std::map<int64_t, std::vector<float>>& seen) {
    data::DataLoader loader(images, {.batch_size = 3,
                                     .seed = 11,
                                     .num_workers = workers,
                                     .sampler = sampler,
                                     .transform = augment});
    for (const data::Batch& b : loader)
      for (size_t k = 0; k < b.indices.size(); ++k) {
        const auto image = b.data.select(0, static_cast<int64_t>(k)).to(kF32).contiguous();
        const auto [it, fresh] = seen.emplace(b.indices[k], image.to_vector<float>());
        EXPECT_TRUE(fresh || it->second == image.to_vector<float>())
            << "sample " << b.indices[k] << " augmented two ways";
      }
  };
  std::map<int64_t, std::vector<float>> alone, split;
  auto one =
      std::make_shared<DistributedSampler>(kSize, 1, 0, DistributedSamplerOptions{.seed = 5});
  one->set_epoch(kEpoch);
  read(one, 0, alone);
  ASSERT_EQ(alone.size(), static_cast<size_t>(kSize));
  // 2 ranks (2 workers each) read the epoch; 3 ranks (1 worker each) continue it from the
  // state after 5 samples of each (10, split from there): every sample read twice is
  // augmented the same way.
  SamplerState saved;
  for (int rank = 0; rank < 2; ++rank) {
    auto before =
        std::make_shared<DistributedSampler>(kSize, 2, rank, DistributedSamplerOptions{.seed = 5});
    before->set_epoch(kEpoch);
    saved = before->state(5);
    read(before, 2, split);
  }
  for (int rank = 0; rank < 3; ++rank) {
    auto after =
        std::make_shared<DistributedSampler>(kSize, 3, rank, DistributedSamplerOptions{.seed = 5});
    after->load_state(saved);
    read(after, 1, split);
  }
  EXPECT_EQ(split, alone);
  // The check can fail: another epoch augments differently.
  std::map<int64_t, std::vector<float>> next;
  one->set_epoch(kEpoch + 1);
  read(one, 0, next);
  EXPECT_NE(next, alone);
}

}  // namespace
}  // namespace ember::dist

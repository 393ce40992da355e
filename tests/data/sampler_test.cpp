// Samplers: coverage (each index once per epoch), reproducibility and epoch reseeding.
#include <ember/data/sampler.h>

#include <algorithm>
#include <numeric>

#include "test_util.h"

namespace ember::data {
namespace {

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), int64_t{0});
  return v;
}

TEST(SequentialSampler, YieldsEveryIndexInOrderEachEpoch) {
  SequentialSampler s(5);
  EXPECT_EQ(s.size(), 5);
  EXPECT_EQ(s.indices(), iota(5));
  s.set_epoch(3);
  EXPECT_EQ(s.epoch(), 3u);
  EXPECT_EQ(s.indices(), iota(5));
  EXPECT_TRUE(SequentialSampler(0).indices().empty());
  EXPECT_EMBER_ERROR(SequentialSampler(-1), "size must be >= 0, got -1");
}

TEST(RandomSampler, EachIndexOncePerEpochAndNewOrderEachEpoch) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    RandomSampler s(n, 42);
    std::vector<std::vector<int64_t>> orders;
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      s.set_epoch(epoch);
      auto order = s.indices();
      ASSERT_EQ(static_cast<int64_t>(order.size()), n);
      auto sorted = order;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(sorted, iota(n)) << "n " << n << " epoch " << epoch;
      orders.push_back(order);
    }
    if (n >= 7) {
      EXPECT_NE(orders[0], orders[1]);
      EXPECT_NE(orders[1], orders[2]);
      EXPECT_NE(orders[0], iota(n));
    }
  }
}

TEST(RandomSampler, OrderIsAPureFunctionOfSeedAndEpoch) {
  RandomSampler a(100, 7), b(100, 7), c(100, 8);
  a.set_epoch(5);
  b.set_epoch(5);
  c.set_epoch(5);
  EXPECT_EQ(a.indices(), b.indices());
  EXPECT_NE(a.indices(), c.indices());
  EXPECT_EQ(a.indices(), random_permutation(100, 7, 5));
  EXPECT_EQ(a.seed(), 7u);
  // Pinned values: the order must not change between builds, platforms or releases, or
  // a resumed run would see different batches.
  EXPECT_EQ(random_permutation(10, 0, 0), (std::vector<int64_t>{4, 5, 7, 0, 6, 2, 8, 9, 3, 1}));
}

// PyTorch's RandomSampler and SequentialSampler (no set_epoch there) give a new iteration
// each pass: the first pass after set_epoch(e) loads e, the next e + 1. A sampler of
// (seed, epoch), as DistributedSampler, loads the selected epoch on every pass.
TEST(Sampler, WhichEpochEachPassLoads) {
  RandomSampler random(10, 1);
  SequentialSampler sequential(4);
  RandomWindowSampler windows(10, 5, 1);
  EXPECT_TRUE(random.moves_on_each_pass() && random.shuffles());
  EXPECT_TRUE(sequential.moves_on_each_pass() && !sequential.shuffles());
  EXPECT_TRUE(!windows.moves_on_each_pass() && windows.shuffles());
  EXPECT_TRUE(random.reports_warnings());  // one process: it speaks for itself

  EXPECT_EQ(random.next_pass_epoch(), 0u);
  EXPECT_EQ(random.start_pass(), random_permutation(10, 1, 0));
  EXPECT_EQ(random.next_pass_epoch(), 1u);
  EXPECT_EQ(random.start_pass(), random_permutation(10, 1, 1));
  EXPECT_EQ(random.epoch(), 1u);
  random.set_epoch(4);
  EXPECT_EQ(random.next_pass_epoch(), 4u);
  EXPECT_EQ(random.start_pass(), random_permutation(10, 1, 4));
  EXPECT_EQ(random.start_pass(), random_permutation(10, 1, 5));
  EXPECT_EQ(sequential.start_pass(), iota(4));
  EXPECT_EQ(sequential.start_pass(), iota(4));
  EXPECT_EQ(sequential.epoch(), 1u);  // new random transforms on the second pass

  windows.set_epoch(4);
  for (int pass = 0; pass < 3; ++pass) {
    EXPECT_EQ(windows.start_pass(), random_window_starts(10, 5, 1, 4));
    EXPECT_EQ(windows.next_pass_epoch(), 4u);
  }
  EXPECT_EQ(windows.epoch(), 4u);
}

TEST(RandomSampler, PositionsAreRoughlyUniform) {
  // Over 4,000 epochs each of 4 indices should land first about 1,000 times.
  std::vector<int> first(4, 0);
  for (uint64_t epoch = 0; epoch < 4000; ++epoch)
    ++first[static_cast<size_t>(random_permutation(4, 1, epoch)[0])];
  for (int count : first) {
    EXPECT_GT(count, 850);
    EXPECT_LT(count, 1150);
  }
}

}  // namespace
}  // namespace ember::data

// How multi-tensor apply packs tensors into CUDA launches (checked on the host): every chunk
// of every tensor exactly once, within the per-launch limits, a tensor cut at a launch's end
// continuing in slot 0 of the next.
#include <map>
#include <utility>

#include <ember/tensor/detail/multi_tensor_plan.h>

#include "test_util.h"

namespace ember::detail {
namespace {

std::vector<MultiTensorLaunch> plan(const std::vector<int64_t>& numels, int64_t chunk,
                                    int max_tensors, int max_blocks) {
  std::vector<MultiTensorLaunch> launches;
  plan_multi_tensor_launches(numels, chunk, max_tensors, max_blocks,
                             [&](const MultiTensorLaunch& l) { launches.push_back(l); });
  return launches;
}

void check_cover(const std::vector<int64_t>& numels, int64_t chunk, int max_tensors,
                 int max_blocks) {
  SCOPED_TRACE(::testing::Message() << "chunk " << chunk << ", max_tensors " << max_tensors
                                    << ", max_blocks " << max_blocks);
  std::map<std::pair<size_t, int64_t>, int> seen;  // (tensor, chunk) -> times
  size_t previous_last_tensor = SIZE_MAX;
  bool previous_cut = false;
  for (const MultiTensorLaunch& l : plan(numels, chunk, max_tensors, max_blocks)) {
    ASSERT_FALSE(l.blocks.empty());
    EXPECT_LE(static_cast<int>(l.slots.size()), max_tensors);
    EXPECT_LE(static_cast<int>(l.blocks.size()), max_blocks);
    if (previous_cut) {
      EXPECT_EQ(l.slots.front(), previous_last_tensor);
    }
    for (const auto& b : l.blocks) {
      ASSERT_GE(b.slot, 0);
      ASSERT_LT(static_cast<size_t>(b.slot), l.slots.size());
      ++seen[{l.slots[static_cast<size_t>(b.slot)], b.chunk}];
    }
    const auto& last = l.blocks.back();
    const size_t t = l.slots[static_cast<size_t>(last.slot)];
    previous_last_tensor = t;
    previous_cut = (last.chunk + 1) * chunk < numels[t];
  }
  size_t expected = 0;
  for (size_t t = 0; t < numels.size(); ++t) {
    for (int64_t c = 0; c * chunk < numels[t]; ++c) {
      ++expected;
      EXPECT_EQ((seen[{t, c}]), 1) << "tensor " << t << " chunk " << c;
    }
  }
  EXPECT_EQ(seen.size(), expected);
}

TEST(MultiTensorPlan, CoversEveryChunkOnceWithinLimits) {
  const std::vector<int64_t> numels = {5, 0, 13, 1, 40, 4, 0, 7, 8, 9, 1, 33, 2};
  for (const int64_t chunk : {1, 4, 16, 1000})
    for (const int max_tensors : {1, 2, 3, 64})
      for (const int max_blocks : {1, 2, 5, 320})
        check_cover(numels, chunk, max_tensors, max_blocks);
}

TEST(MultiTensorPlan, CutsALargeTensorAtTheBlockLimit) {
  // ResNet-sized numbers: 86 tensors, then one of 330 chunks crossing the 320-block limit.
  std::vector<int64_t> numels(80, 13);
  numels.push_back(65536 * 330);
  const auto launches = plan(numels, 65536, 36, 320);
  ASSERT_EQ(launches.size(), 4u);  // 36 + 36 tensors, then 8 small + 312 chunks, then 18 chunks
  EXPECT_EQ(launches[0].blocks.size(), 36u);
  EXPECT_EQ(launches[2].slots.size(), 9u);
  EXPECT_EQ(launches[2].blocks.size(), 320u);
  EXPECT_EQ(launches[3].slots, std::vector<size_t>{80});
  EXPECT_EQ(launches[3].blocks.size(), 18u);
  EXPECT_EQ(launches[3].blocks.front().chunk, 312);
}

TEST(MultiTensorPlan, NothingToLaunchForEmptyTensors) {
  EXPECT_TRUE(plan({0, 0}, 4, 2, 2).empty());
  EXPECT_TRUE(plan({}, 4, 2, 2).empty());
}

}  // namespace
}  // namespace ember::detail

// DistributedSampler: PyTorch's sharding and padding rules (every rank's shard is computed
// here for several world sizes), set_epoch as PyTorch defines it (a peek then a loop, passes
// repeating an epoch, rank 0's warning), the default group, a mid-epoch restore through a
// DataLoader, and a resumed training run that selects its epochs the PyTorch way.
#include <algorithm>
#include <chrono>
#include <set>

#include <ember/data/dataloader.h>
#include <ember/dist/api.h>
#include <ember/dist/distributed_sampler.h>
#include <ember/dist/init.h>
#include <ember/dist/window_sampler.h>
#include <ember/nn/layers.h>
#include <ember/optim/sgd.h>
#include <ember/tensor/layer_ops.h>
#include <ember/tensor/random.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using testing::world;

std::vector<std::vector<int64_t>> shards(int64_t n, int world_size, DistributedSamplerOptions o,
                                         uint64_t epoch = 0) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world_size; ++r) {
    DistributedSampler s(n, world_size, r, o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
    EXPECT_EQ(static_cast<int64_t>(out.back().size()), s.size());
  }
  return out;
}

TEST(DistributedSampler, UnshuffledShardsAreStridedAndPaddedFromTheStart) {
  DistributedSamplerOptions o;
  o.shuffle = false;
  using V = std::vector<std::vector<int64_t>>;
  // As torch.utils.data.DistributedSampler(range(10), 3, r, shuffle=False).
  EXPECT_EQ(shards(10, 3, o), (V{{0, 3, 6, 9}, {1, 4, 7, 0}, {2, 5, 8, 1}}));
  EXPECT_EQ(shards(1, 3, o), (V{{0}, {0}, {0}}));  // padding repeats as often as needed
  o.drop_last = true;
  EXPECT_EQ(shards(10, 3, o), (V{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(shards(9, 3, o), (V{{0, 3, 6}, {1, 4, 7}, {2, 5, 8}}));
  EXPECT_EQ(shards(2, 3, o), (V{{}, {}, {}}));
}

TEST(DistributedSampler, ShuffledShardsAreDisjointAndCoverTheDataset) {
  for (int world_size : {1, 2, 3, 4}) {
    for (int64_t n : {0, 7, 12, 13}) {
      for (bool drop_last : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << "world " << world_size << " n " << n << " drop_last " << drop_last);
        DistributedSamplerOptions o;
        o.seed = 17;
        o.drop_last = drop_last;
        const auto parts = shards(n, world_size, o, 4);
        std::vector<int64_t> all;
        for (const auto& p : parts) {
          EXPECT_EQ(p.size(), parts[0].size());  // every rank takes the same number of steps
          all.insert(all.end(), p.begin(), p.end());
        }
        const std::set<int64_t> distinct(all.begin(), all.end());
        if (drop_last) {
          EXPECT_EQ(distinct.size(), all.size());  // disjoint
          EXPECT_EQ(static_cast<int64_t>(all.size()), n / world_size * world_size);
        } else {
          EXPECT_EQ(static_cast<int64_t>(distinct.size()), n);  // covering
          EXPECT_EQ(static_cast<int64_t>(all.size()),
                    (n + world_size - 1) / world_size * world_size);
        }
        for (int64_t i : all) EXPECT_TRUE(i >= 0 && i < n);
      }
    }
  }
}

TEST(DistributedSampler, SetEpochReshufflesTheSameWayOnEveryRank) {
  auto pg = world();
  DistributedSampler sampler(50, *pg, {.seed = 3});
  EXPECT_EQ(sampler.num_replicas(), pg->size());
  EXPECT_EQ(sampler.rank(), pg->rank());
  sampler.set_epoch(1);
  const auto epoch1 = sampler.indices();
  EXPECT_EQ(sampler.indices(), epoch1);  // a pure function of (seed, epoch)
  sampler.set_epoch(2);
  EXPECT_NE(sampler.indices(), epoch1);
  DistributedSampler other_seed(50, *pg, {.seed = 4});
  other_seed.set_epoch(1);
  EXPECT_NE(other_seed.indices(), epoch1);
  // Ranks agree on the permutation: the shards of one epoch are disjoint across the group.
  Tensor mine = zeros({50}, kI64);
  sampler.set_epoch(1);
  for (int64_t i : sampler.indices()) mine.data_ptr<int64_t>()[i] += 1;
  pg->allreduce(mine, ReduceOp::kSum)->wait();
  const auto counts = mine.to_vector<int64_t>();
  const int64_t padded = sampler.total_size() - 50;
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 0), 0);
  EXPECT_EQ(std::count(counts.begin(), counts.end(), 2), padded);
}

TEST(DistributedSampler, ResumesMidEpochThroughTheDataLoader) {
  DistributedSampler full(23, 2, 1, {.seed = 9});
  full.set_epoch(5);
  const auto order = full.indices();
  ASSERT_EQ(order.size(), 12u);

  auto resumed =
      std::make_shared<DistributedSampler>(23, 2, 1, DistributedSamplerOptions{.seed = 9});
  resumed->set_epoch(5);
  resumed->set_position(4);
  EXPECT_EQ(resumed->size(), 8);
  auto data =
      std::make_shared<data::TensorDataset>(arange(23, kF32).view({23, 1}), arange(23, kI64));
  data::DataLoader loader(data, {.batch_size = 3, .sampler = resumed});
  loader.set_epoch(5);  // the loader re-selects the same epoch: the position holds
  std::vector<int64_t> seen;
  for (const auto& b : loader) seen.insert(seen.end(), b.indices.begin(), b.indices.end());
  EXPECT_EQ(seen, std::vector<int64_t>(order.begin() + 4, order.end()));
  // The next epoch starts from its beginning.
  resumed->set_epoch(6);
  EXPECT_EQ(resumed->position(), 0);
  EXPECT_EQ(resumed->size(), 12);

  EXPECT_EMBER_ERROR(resumed->set_position(13), "position 13 is outside [0, 12]");
  EXPECT_EMBER_ERROR(DistributedSampler(10, 2, 2), "rank 2 is outside [0, 2)");
  EXPECT_EMBER_ERROR(DistributedSampler(10, 0, 0), "num_replicas must be positive");
}

// Every index of a loader's pass, in order; `peek` stops after the first batch.
std::vector<int64_t> pass_order(data::DataLoader& loader, bool peek = false) {
  std::vector<int64_t> order;
  for (const data::Batch& b : loader) {
    order.insert(order.end(), b.indices.begin(), b.indices.end());
    if (peek) break;
  }
  return order;
}

// PyTorch's habit: sampler.set_epoch(e), x, y = next(iter(loader)) to look at a batch, then
// `for b in loader`: the loop gets epoch e's order, as a fresh sampler at epoch e gives it.
TEST(DistributedSampler, PeekThenLoopLoadsTheEpochSetEpochSelected) {
  auto pg = world();
  auto data = std::make_shared<data::TensorDataset>(zeros({50, 1}), zeros({50}, kI64));
  for (int workers : {0, 2}) {
    auto sampler =
        std::make_shared<DistributedSampler>(50, *pg, DistributedSamplerOptions{.seed = 3});
    data::DataLoader loader(data, {.batch_size = 4, .num_workers = workers, .sampler = sampler});
    for (uint64_t epoch : {0, 1, 2}) {
      sampler->set_epoch(epoch);
      const data::Batch peeked = *loader.begin();
      const std::vector<int64_t> loop = pass_order(loader);
      DistributedSampler fresh(50, *pg, {.seed = 3});
      fresh.set_epoch(epoch);
      EXPECT_EQ(loop, fresh.indices()) << "epoch " << epoch << ", " << workers << " workers";
      EXPECT_EQ(peeked.indices, std::vector<int64_t>(loop.begin(), loop.begin() + 4));
    }
  }
}

// Without set_epoch() between them, passes repeat the epoch's order, as in PyTorch; rank 0
// (only) says once what to call.
TEST(DistributedSampler, PassesWithoutSetEpochRepeatAndRankZeroWarnsOnce) {
  auto pg = world();
  auto data = std::make_shared<data::TensorDataset>(zeros({30, 1}), zeros({30}, kI64));
  auto sampler =
      std::make_shared<DistributedSampler>(30, *pg, DistributedSamplerOptions{.seed = 1});
  data::DataLoader loader(data, {.batch_size = 4, .sampler = sampler});
  sampler->set_epoch(6);
  std::vector<std::vector<int64_t>> passes;
  ::testing::internal::CaptureStderr();
  for (int pass = 0; pass < 3; ++pass) passes.push_back(pass_order(loader));
  const std::string said = ::testing::internal::GetCapturedStderr();
  DistributedSampler fresh(30, *pg, {.seed = 1});
  fresh.set_epoch(6);
  for (const auto& order : passes) EXPECT_EQ(order, fresh.indices());
  const std::string advice = "call sampler->set_epoch(epoch) before each epoch";
  size_t warnings = 0;
  for (size_t at = said.find(advice); at != std::string::npos; at = said.find(advice, at + 1))
    ++warnings;
  EXPECT_EQ(warnings, pg->rank() == 0 ? 1u : 0u) << said;
  // An unshuffled sampler's passes are the same whatever the epoch: nothing to say.
  auto in_order =
      std::make_shared<DistributedSampler>(30, *pg, DistributedSamplerOptions{.shuffle = false});
  data::DataLoader plain(data, {.batch_size = 4, .sampler = in_order});
  ::testing::internal::CaptureStderr();
  pass_order(plain);
  pass_order(plain);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

// torch.distributed's DistributedSampler(dataset): num_replicas and rank from the default
// group; before init_process_group() an error that says what to do.
TEST(DistributedSampler, WithoutAGroupTakesTheDefaultGroup) {
  testing::DefaultGroupGuard guard;
  ASSERT_FALSE(is_initialized());
  auto data = std::make_shared<data::TensorDataset>(zeros({40, 1}), zeros({40}, kI64));
  const std::string before =
      "no group given and the default process group is not initialized: call "
      "dist::init_process_group() first, or pass num_replicas and rank (or a group)";
  EXPECT_EMBER_ERROR(DistributedSampler{data}, "DistributedSampler: " + before);
  EXPECT_EMBER_ERROR(DistributedSampler{*data}, "DistributedSampler: " + before);
  EXPECT_EMBER_ERROR(DistributedSampler(40, {.seed = 2}), "DistributedSampler: " + before);
  EXPECT_EMBER_ERROR(DistributedWindowSampler(1000, 64), "DistributedWindowSampler: " + before);
  EXPECT_EMBER_ERROR(DistributedSampler(std::shared_ptr<const data::Dataset>()), "dataset is null");

  init_process_group({.device = kCPU, .timeout = std::chrono::seconds(60)});
  const int world_size = get_world_size(), rank = get_rank();
  DistributedSampler explicit_ranks(40, world_size, rank, {.seed = 2});
  explicit_ranks.set_epoch(3);
  std::vector<DistributedSampler> made;
  made.emplace_back(data, DistributedSamplerOptions{.seed = 2});
  made.emplace_back(*data, DistributedSamplerOptions{.seed = 2});
  made.emplace_back(40, DistributedSamplerOptions{.seed = 2});
  for (DistributedSampler& s : made) {
    EXPECT_EQ(s.num_replicas(), world_size);
    EXPECT_EQ(s.rank(), rank);
    s.set_epoch(3);
    EXPECT_EQ(s.indices(), explicit_ranks.indices());
  }
  DistributedWindowSampler windows(1000, 64, {.seed = 4});
  EXPECT_EQ(windows.num_replicas(), world_size);
  EXPECT_EQ(windows.indices(),
            DistributedWindowSampler(1000, 64, world_size, rank, {.seed = 4}).indices());
  // The tutorial's loader, as written in PyTorch.
  data::DataLoader loader(data,
                          {.batch_size = 8, .sampler = std::make_shared<DistributedSampler>(data)});
  EXPECT_EQ(loader.size(), (40 / world_size + (40 % world_size != 0) + 7) / 8);
}

// A run in the shape of a PyTorch script: rank 1 of 2's shard, sampler->set_epoch(e) before
// each epoch, the model and optimizer saved after `stop_after` epochs and loaded into fresh
// objects (a fresh sampler and loader too) that train the remaining epochs. Returns every
// step's loss.
std::vector<double> train_with_sampler(int64_t epochs, int64_t stop_after) {
  Generator gen(11);
  auto data = std::make_shared<data::TensorDataset>(randn({30, 4}, kF64, &gen),
                                                    randint(0, 3, {30}, kI64, &gen));
  std::vector<double> losses;
  nn::NamedTensors saved_model;
  optim::StateDict saved_optimizer;
  for (int64_t start = 0, end = 0; start < epochs; start = end) {
    manual_seed(5);
    nn::Linear model(4, 3);
    model.to(kF64);
    optim::SGD sgd(model.parameters(), {.lr = 0.2, .momentum = 0.9});
    if (start > 0) {
      model.load_state_dict(saved_model);
      sgd.load_state_dict(saved_optimizer);
    }
    auto sampler =
        std::make_shared<DistributedSampler>(30, 2, 1, DistributedSamplerOptions{.seed = 7});
    data::DataLoader loader(data, {.batch_size = 4, .num_workers = 2, .sampler = sampler});
    end = start < stop_after ? stop_after : epochs;
    for (int64_t epoch = start; epoch < end; ++epoch) {
      sampler->set_epoch(static_cast<uint64_t>(epoch));
      for (const data::Batch& batch : loader) {
        sgd.zero_grad();
        Tensor loss = cross_entropy(model(batch.data), batch.target);
        loss.backward();
        sgd.step();
        losses.push_back(loss.item<double>());
      }
    }
    saved_model.clear();
    for (const auto& [name, t] : model.state_dict()) saved_model.emplace_back(name, t.clone());
    saved_optimizer = sgd.state_dict();
  }
  return losses;
}

TEST(DistributedSampler, AResumedRunSelectingItsEpochLikePyTorchEqualsTheUninterruptedOne) {
  const std::vector<double> uninterrupted = train_with_sampler(4, 4);
  ASSERT_EQ(uninterrupted.size(), 16u);  // 4 epochs of 15 samples, batches of 4
  // Stopped after epoch 1 (and after epoch 3 of a longer run cut short): every loss equals
  // the uninterrupted run's, so the fresh loader shuffled epochs 2 and 3 as epochs 2 and 3.
  EXPECT_EQ(train_with_sampler(4, 2), uninterrupted);
  EXPECT_EQ(train_with_sampler(4, 3), uninterrupted);
}

}  // namespace
}  // namespace ember::dist

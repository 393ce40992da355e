// GPT training under data parallelism: random text windows sharded across ranks
// (DistributedWindowSampler), and gradient clipping by global norm after DDP's all-reduce,
// alone and behind GradScaler's unscale_, matching one process on the full batch.
#include <algorithm>
#include <set>

#include <ember/data/sampler.h>
#include <ember/dist/amp.h>
#include <ember/dist/ddp.h>
#include <ember/dist/window_sampler.h>
#include <ember/nn/gpt.h>
#include <ember/optim/adam.h>
#include <ember/optim/clip_grad.h>
#include <ember/optim/grad_scaler.h>
#include <ember/optim/param_groups.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using testing::expect_same_state;
using testing::shard_rows;
using testing::world;

// Every rank's shard of one epoch, computed here for `world_size` ranks.
std::vector<std::vector<int64_t>> window_shards(int64_t windows, int64_t samples, int world_size,
                                                WindowSamplerOptions o, uint64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world_size; ++r) {
    DistributedWindowSampler s(windows, samples, world_size, r, o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
    EXPECT_EQ(static_cast<int64_t>(out.back().size()), s.size());
  }
  return out;
}

TEST(DistributedWindowSampler, RanksGetDisjointShardsOfOneDraw) {
  for (int world_size : {1, 2, 3, 4}) {
    SCOPED_TRACE(world_size);
    const auto shards = window_shards(500, 30, world_size, {.seed = 9}, 2);
    const int64_t per_rank = (30 + world_size - 1) / world_size;
    const auto draw = data::random_window_starts(500, per_rank * world_size, 9, 2);
    std::set<int64_t> seen;
    for (int r = 0; r < world_size; ++r) {
      ASSERT_EQ(static_cast<int64_t>(shards[static_cast<size_t>(r)].size()), per_rank);
      for (int64_t k = 0; k < per_rank; ++k) {
        const int64_t start = shards[static_cast<size_t>(r)][static_cast<size_t>(k)];
        EXPECT_EQ(start, draw[static_cast<size_t>(r + k * world_size)]);
        EXPECT_TRUE(seen.insert(start).second) << "window " << start << " twice";
      }
    }
  }
  // A world of one is RandomWindowSampler.
  data::RandomWindowSampler single(500, 30, 9);
  single.set_epoch(2);
  EXPECT_EQ(window_shards(500, 30, 1, {.seed = 9}, 2)[0], single.indices());
  // Another epoch draws other windows.
  EXPECT_NE(window_shards(500, 30, 2, {.seed = 9}, 3), window_shards(500, 30, 2, {.seed = 9}, 2));
}

TEST(DistributedWindowSampler, DropLastPositionAndLimits) {
  const auto dropped = window_shards(100, 10, 3, {.seed = 1, .drop_last = true}, 0);
  for (const auto& shard : dropped) EXPECT_EQ(shard.size(), 3u);  // floor(10 / 3)
  DistributedWindowSampler s(100, 10, 3, 1, {.seed = 1});
  EXPECT_EQ(s.num_samples(), 4);
  EXPECT_EQ(s.total_size(), 12);
  EXPECT_EQ(s.num_windows(), 100);
  const auto all = s.indices();
  s.set_position(2);  // a resumed run continues mid-epoch
  EXPECT_EQ(s.indices(), std::vector<int64_t>(all.begin() + 2, all.end()));
  EXPECT_EQ(s.size(), 2);
  s.set_epoch(1);
  EXPECT_EQ(s.position(), 0);
  EXPECT_EMBER_ERROR(DistributedWindowSampler(10, 10, 3, 0),
                     "DistributedWindowSampler: 3 ranks of 4 windows need 12 distinct windows, "
                     "but the dataset has 10");
  EXPECT_EQ(DistributedWindowSampler(12, 10, 3, 2).indices().size(), 4u);
  auto pg = world();
  DistributedWindowSampler from_group(1000, 64, *pg, {.seed = 4});
  EXPECT_EQ(from_group.indices(),
            DistributedWindowSampler(1000, 64, pg->size(), pg->rank(), {.seed = 4}).indices());
}

std::shared_ptr<nn::Module> mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 8), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 3)});
}

std::pair<Tensor, Tensor> batch(int64_t n, uint64_t seed) {
  Generator gen(seed);
  return {randn({n, 4}, kF32, &gen), randint(0, 3, {n}, kI64, &gen)};
}

// Rank 0's values of every parameter equal this rank's, bit for bit.
void expect_same_on_every_rank(nn::Module& model, ProcessGroup& pg) {
  for (const auto& [name, p] : model.named_parameters()) {
    SCOPED_TRACE(name);
    Tensor root = p.detach().clone();
    pg.broadcast(root, 0)->wait();
    EXPECT_EQ(root.to_vector<float>(), p.detach().to_vector<float>());
  }
}

// DDP averages the gradients during backward; clip_grad_norm_ after it sees the same gradients
// on every rank, so every rank computes the same norm and scale, and the run follows one
// process clipping the full batch's gradient. AdamW with weight_decay_groups, as GPT trains.
void clip_after_ddp(bool grad_scaler) {
  auto pg = world();
  const int64_t global = 12;  // divisible by 1, 2 and 3 ranks
  const double max_norm = 0.05;
  auto reference = mlp(5);
  optim::AdamW ref_opt(optim::weight_decay_groups(*reference, 0.1), {.lr = 0.01});
  optim::GradScaler ref_scaler({.enabled = grad_scaler});
  auto ddp = std::make_shared<DistributedDataParallel>(mlp(5), pg);
  optim::AdamW opt(optim::weight_decay_groups(ddp->module(), 0.1), {.lr = 0.01});
  optim::GradScaler scaler({.enabled = grad_scaler}, make_found_inf_agreement(pg));
  for (int step = 0; step < 8; ++step) {
    auto [x, y] = batch(global, 40 + static_cast<uint64_t>(step));
    ref_opt.zero_grad();
    ref_scaler.scale(cross_entropy((*reference)(x), y)).backward();
    ref_scaler.unscale_(ref_opt);
    const double ref_norm =
        optim::clip_grad_norm_(reference->parameters(), max_norm).item<double>();
    ref_scaler.step(ref_opt);
    ref_scaler.update();

    opt.zero_grad();
    scaler.scale(cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg))).backward();
    scaler.unscale_(opt);  // the true (averaged) gradients, before clipping
    const Tensor norm = optim::clip_grad_norm_(ddp->parameters(), max_norm);
    EXPECT_GT(norm.item<double>(), max_norm);  // clipping is active
    EXPECT_NEAR(norm.item<double>(), ref_norm, 1e-5 * ref_norm);
    Tensor root_norm = norm.clone();
    pg->broadcast(root_norm, 0)->wait();
    EXPECT_EQ(root_norm.item<double>(), norm.item<double>());  // the same on every rank
    EXPECT_TRUE(scaler.step(opt));
    scaler.update();
  }
  EXPECT_EQ(scaler.get_scale(), ref_scaler.get_scale());
  expect_same_state(ddp->module(), *reference, 1e-4, 1e-6);
  expect_same_on_every_rank(ddp->module(), *pg);
}

TEST(GradClipUnderDDP, EqualsOneProcessOnTheFullBatch) { clip_after_ddp(false); }

TEST(GradClipUnderDDP, AfterGradScalerUnscaleEqualsOneProcessOnTheFullBatch) {
  clip_after_ddp(true);
}

// A GPT trained 10 steps under DDP (each rank a shard of the batch's sequences) follows one
// process training on the whole batch: AdamW with weight_decay_groups, clipping at 1.
TEST(GPTUnderDDP, TenStepsEqualOneProcessOnTheFullBatch) {
  auto pg = world();
  nn::GPTConfig c;
  c.vocab_size = 13;
  c.block_size = 8;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 16;
  c.dropout = 0.0;
  // f64: the key bias's true gradient is 0 (it shifts a query's scores by a constant), and
  // Adam would turn f32 rounding noise there into steps of either sign.
  manual_seed(11);
  auto reference = std::make_shared<nn::GPT>(c);
  reference->to(kF64);
  manual_seed(11);
  auto local = std::make_shared<nn::GPT>(c);
  local->to(kF64);
  auto ddp = std::make_shared<DistributedDataParallel>(local, pg);
  const optim::AdamWOptions options{.lr = 3e-3, .betas = {0.9, 0.95}};
  optim::AdamW ref_opt(optim::weight_decay_groups(*reference, 0.1), options);
  optim::AdamW opt(optim::weight_decay_groups(ddp->module(), 0.1), options);
  auto loss_of = [](const Tensor& logits, const Tensor& targets) {
    return cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
  };
  for (int step = 0; step < 10; ++step) {
    Generator gen(70 + static_cast<uint64_t>(step));
    const Tensor idx = randint(0, c.vocab_size, {12, c.block_size}, kI64, &gen);
    const Tensor targets = randint(0, c.vocab_size, {12, c.block_size}, kI64, &gen);
    ref_opt.zero_grad();
    loss_of((*reference)(idx), targets).backward();
    optim::clip_grad_norm_(reference->parameters(), 1.0);
    ref_opt.step();

    opt.zero_grad();
    loss_of((*ddp)(shard_rows(idx, *pg)), shard_rows(targets, *pg)).backward();
    optim::clip_grad_norm_(ddp->parameters(), 1.0);
    opt.step();
  }
  expect_same_state(ddp->module(), *reference, 1e-9, 1e-12);
  for (const auto& [name, p] : ddp->module().named_parameters()) {
    SCOPED_TRACE(name);
    Tensor root = p.detach().clone();
    pg->broadcast(root, 0)->wait();
    EXPECT_EQ(root.to_vector<double>(), p.detach().to_vector<double>());
  }
}

}  // namespace
}  // namespace ember::dist

// GradScaler across ranks: with dist::make_found_inf_agreement every rank skips the step
// that any rank found an inf in, and the scales stay equal. Runs at any world size (1 under
// plain ctest, 2 and 3 under mpirun).
#include <unistd.h>

#include <filesystem>
#include <limits>
#include <string>

#include <ember/dist/amp.h>
#include <ember/dist/checkpoint.h>
#include <ember/dist/ddp.h>
#include <ember/optim/sgd.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using testing::world;

// Local (un-synced) replicas, as under no_sync or with sharded gradients: each rank's
// gradient is its own; `bad_rank` gets an inf in iteration 1.
std::vector<bool> run(optim::GradScaler& scaler, int rank, int bad_rank, Tensor& w) {
  optim::SGD opt({w}, {.lr = 0.1});
  std::vector<bool> ran;
  for (int it = 0; it < 3; ++it) {
    opt.zero_grad();
    scaler.scale(sum(mul(w, w))).backward();
    if (it == 1 && rank == bad_rank) Tensor(w.grad()).fill_(std::numeric_limits<float>::infinity());
    ran.push_back(scaler.step(opt));
    scaler.update();
  }
  return ran;
}

TEST(FoundInfAgreement, EveryRankSkipsTheStepAnyRankFoundAnInfIn) {
  auto pg = world();
  const int bad_rank = pg->size() - 1;
  optim::GradScaler scaler({.init_scale = 1024.0}, make_found_inf_agreement(pg));
  Tensor w = ones({4}).requires_grad_();
  EXPECT_EQ(run(scaler, pg->rank(), bad_rank, w), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(scaler.get_scale(), 512.0);
  // Same parameters on every rank: two updates of w -= 0.1 * 2w from 1.
  const Tensor expected = full({4}, 0.64);
  ember::testing::expect_close(w, expected, 1e-6, 1e-7);
  Tensor scale = full({1}, scaler.get_scale());
  pg->allreduce(scale, ReduceOp::kMin)->wait();
  EXPECT_EQ(scale.item<double>(), 512.0);
}

TEST(FoundInfAgreement, WithoutItOnlyTheRankWithTheInfSkips) {
  auto pg = world();
  if (pg->size() < 2) GTEST_SKIP() << "needs 2 ranks";
  optim::GradScaler scaler({.init_scale = 1024.0});
  Tensor w = ones({4}).requires_grad_();
  const bool bad = pg->rank() == 0;
  EXPECT_EQ(run(scaler, pg->rank(), 0, w), (std::vector<bool>{true, !bad, true}));
  EXPECT_EQ(scaler.get_scale(), bad ? 512.0 : 1024.0);
}

// fp16 autocast under DDP: gradients reach the (f32) buckets and the parameters in f32, the
// replicas stay identical, and an inf on one rank's batch skips the step on every rank.
TEST(FoundInfAgreement, Fp16AutocastUnderDdpKeepsF32GradientsAndSkipsTogether) {
  auto pg = world();
  manual_seed(3);
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 8), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(8, 3)});
  auto ddp = std::make_shared<DistributedDataParallel>(net, pg);
  optim::SGD opt(ddp->parameters(), {.lr = 0.1});
  optim::GradScaler scaler({}, make_found_inf_agreement(pg));
  std::vector<bool> ran;
  for (int step = 0; step < 3; ++step) {
    manual_seed(100 + static_cast<uint64_t>(step * 10 + pg->rank()));
    Tensor x = randn({4, 6});
    const Tensor y = randint(0, 3, {4});
    if (step == 1 && pg->rank() == pg->size() - 1) x.narrow(0, 0, 1).fill_(1e30);  // f16: inf
    Tensor loss;
    {
      AutocastGuard autocast(kCPU, kF16);
      loss = cross_entropy((*ddp)(x), y);
    }
    opt.zero_grad();
    scaler.scale(loss).backward();
    for (const Tensor& p : ddp->parameters()) ASSERT_EQ(p.grad().dtype(), kF32);
    ran.push_back(scaler.step(opt));
    scaler.update();
  }
  EXPECT_EQ(ran, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(scaler.get_scale(), 32768.0);
  for (const Tensor& p : ddp->parameters()) {
    EXPECT_EQ(p.dtype(), kF32);
    Tensor lo = p.detach().clone(), hi = p.detach().clone();
    pg->allreduce(lo, ReduceOp::kMin)->wait();
    pg->allreduce(hi, ReduceOp::kMax)->wait();
    EXPECT_TRUE(equal(lo, hi)) << "replicas differ";
  }
}

// Checkpoints carry the scaler's state; a checkpoint without one (an fp32 or bf16 run's)
// leaves the scaler as it is, so it loads into an fp16 run too.
TEST(GradScalerCheckpoint, SavedAndRestoredBesideTheModel) {
  auto pg = world();
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("ember_scaler_" + std::to_string(getpid()) + "_" +
                                                std::to_string(pg->rank()) + ".safetensors");
  optim::GradScaler saved({.init_scale = 1024.0, .growth_interval = 7});
  Tensor w = ones({4}).requires_grad_();
  run(saved, 0, -1, w);  // 3 clean steps
  Checkpoint with;
  with.grad_scaler = &saved;
  save_checkpoint(path.string(), with);

  optim::GradScaler restored;
  Checkpoint into;
  into.grad_scaler = &restored;
  load_checkpoint(path.string(), into);
  EXPECT_EQ(restored.get_scale(), 1024.0);
  EXPECT_EQ(restored.get_growth_tracker(), 3);
  EXPECT_EQ(restored.get_growth_interval(), 7);

  save_checkpoint(path.string(), Checkpoint{});  // no scaler in the file
  optim::GradScaler fresh({.init_scale = 8.0});
  Checkpoint into_fresh;
  into_fresh.grad_scaler = &fresh;
  load_checkpoint(path.string(), into_fresh);
  EXPECT_EQ(fresh.get_scale(), 8.0);
  std::filesystem::remove(path);
}

TEST(FoundInfAgreement, NullGroupIsRefused) {
  EXPECT_EMBER_ERROR(make_found_inf_agreement(nullptr), "process group is null");
}

}  // namespace
}  // namespace ember::dist

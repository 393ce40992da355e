// GradScaler across ranks: with dist::make_found_inf_agreement every rank skips the step
// that any rank found an inf in, and the scales stay equal. Runs at any world size (1 under
// plain ctest, 2 and 3 under mpirun).
#include <limits>

#include <ember/dist/amp.h>
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

TEST(FoundInfAgreement, NullGroupIsRefused) {
  EXPECT_EMBER_ERROR(make_found_inf_agreement(nullptr), "process group is null");
}

}  // namespace
}  // namespace ember::dist

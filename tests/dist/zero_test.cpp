// ZeroRedundancyOptimizer (ZeRO-1) and DDP's gradient sharding (ZeRO-2) against DDP + the plain
// optimizer at whatever world size the launcher made (1, 2 or 3 ranks, MPI or TCP): the
// parameters after training agree bit for bit at up to 2 ranks on the CPU and within 1e-6
// relative at 3 (the reduction's summation order), with the GradScaler, clipping and no_sync
// accumulation; the consolidated state is the plain optimizer's and loads both ways.
#include <limits>

#include <ember/dist/ddp.h>
#include <ember/dist/join.h>
#include <ember/dist/nccl_process_group.h>
#include <ember/dist/zero.h>
#include <ember/optim/adam.h>
#include <ember/optim/clip_grad.h>
#include <ember/optim/grad_scaler.h>
#include <ember/optim/sgd.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using testing::shard_rows;
using testing::world;

std::shared_ptr<nn::Module> net(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 16), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(16, 12), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(12, 3)});
}

// Small buckets, so that a model of a few parameters spans several.
DDPOptions small_buckets() {
  DDPOptions o;
  o.bucket_cap_bytes = 600;
  o.first_bucket_cap_bytes = 300;
  return o;
}

OptimizerFactory sgd() {
  return optimizer_factory<optim::SGD>(optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
}
OptimizerFactory adamw() {
  return optimizer_factory<optim::AdamW>(optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1});
}

// Bit for bit at up to 2 ranks on the CPU, else within 1e-6 relative.
void expect_same(const Tensor& actual, const Tensor& expected, int world_size) {
  if (world_size <= 2 && actual.is_cpu()) {
    EXPECT_TRUE(equal(actual.detach(), expected.detach()))
        << "max difference " << max(abs(sub(actual.detach(), expected.detach()))).item<double>();
  } else {
    ::ember::testing::expect_close(actual.detach(), expected.detach(), 1e-6, 1e-7);
  }
}

struct Features {
  bool scaler = false;
  bool clip = false;
  bool accumulate = false;
  bool synced_twice = false;  // two synced backward passes, no zero_grad between them
  Device device = kCPU;
};

// One replica under training: DDP + an optimizer (plain or ZeRO), with its scaler.
struct Replica {
  std::shared_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  ZeroRedundancyOptimizer* zero = nullptr;
  optim::GradScaler scaler{{.init_scale = 256.0}};

  void train_step(int step, const Features& f, ProcessGroup& pg) {
    opt->zero_grad();
    const int micro = f.accumulate || f.synced_twice ? 2 : 1;
    for (int m = 0; m < micro; ++m) {
      Generator gen(static_cast<uint64_t>(1000 + 10 * step + m));
      const Tensor x = randn({12, 6}, kF32, &gen).to(f.device);
      const Tensor y = randint(0, 3, {12}, kI64, &gen).to(f.device);
      auto backward = [&] {
        Tensor loss = cross_entropy((*ddp)(shard_rows(x, pg)), shard_rows(y, pg));
        (f.scaler ? scaler.scale(loss) : loss).backward();
      };
      if (m + 1 < micro && !f.synced_twice) {
        auto no_sync = ddp->no_sync();
        backward();
      } else {
        backward();
      }
    }
    if (f.scaler && step == 2) {
      // An inf in one gradient after the reduction (under ZeRO-2 only its owner has it): every
      // rank must skip the step.
      const Tensor& g = ddp->parameters().front().grad();
      if (g.defined()) Tensor(g).fill_(std::numeric_limits<float>::infinity());
    }
    if (f.clip) {
      if (f.scaler) scaler.unscale_(*opt);
      if (zero != nullptr) {
        zero->clip_grad_norm_(0.05);
      } else {
        optim::clip_grad_norm_(ddp->parameters(), 0.05);
      }
    }
    if (f.scaler) {
      scaler.step(*opt);
      scaler.update();
    } else {
      opt->step();
    }
  }
};

std::shared_ptr<nn::Module> net_on(Device device) {
  auto model = net(3);
  model->to(device);
  return model;
}

Replica plain(const OptimizerFactory& make, const std::shared_ptr<ProcessGroup>& pg,
              Device device = kCPU) {
  Replica r;
  r.ddp = std::make_shared<DistributedDataParallel>(net_on(device), pg, small_buckets());
  r.opt = make({optim::ParamGroup(r.ddp->parameters())});
  return r;
}

Replica sharded(const OptimizerFactory& make, const std::shared_ptr<ProcessGroup>& pg, int stage,
                Device device = kCPU) {
  Replica r;
  r.ddp = std::make_shared<DistributedDataParallel>(net_on(device), pg, small_buckets());
  auto zero = std::make_unique<ZeroRedundancyOptimizer>(r.ddp->parameters(), make, pg);
  if (stage == 2) zero->shard_gradients(*r.ddp);
  r.zero = zero.get();
  r.opt = std::move(zero);
  return r;
}

void expect_same_parameters(Replica& actual, Replica& expected, int world_size) {
  const auto a = actual.ddp->parameters();
  const auto e = expected.ddp->parameters();
  ASSERT_EQ(a.size(), e.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE("parameter " + std::to_string(i));
    expect_same(a[i], e[i], world_size);
  }
}

void compare(const OptimizerFactory& make, int stage, const Features& f,
             std::shared_ptr<ProcessGroup> pg = world(), int steps = 5) {
  Replica reference = plain(make, pg, f.device);
  Replica zero = sharded(make, pg, stage, f.device);
  for (int step = 0; step < steps; ++step) {
    reference.train_step(step, f, *pg);
    zero.train_step(step, f, *pg);
  }
  if (f.synced_twice) {
    // The held average enters the second reduction as the ranks' sum: another summation
    // order than DDP's, so equal to rounding.
    for (size_t i = 0; i < zero.ddp->parameters().size(); ++i)
      ::ember::testing::expect_close(zero.ddp->parameters()[i].detach(),
                                     reference.ddp->parameters()[i].detach(), 1e-6, 1e-7);
  } else {
    expect_same_parameters(zero, reference, pg->size());
  }
  if (f.scaler) {
    EXPECT_EQ(zero.scaler.get_scale(), reference.scaler.get_scale());
    EXPECT_EQ(reference.scaler.get_scale(), 128.0);  // the inf step backed off once
  }
  if (stage == 2) {
    // Between steps each rank holds its own shard's gradients only.
    for (const Tensor& p : zero.ddp->parameters())
      EXPECT_EQ(p.grad().defined(), zero.zero->owner(p) == pg->rank());
  }
}

class Zero : public ::testing::TestWithParam<int> {};

TEST_P(Zero, SgdMomentumMatchesDdp) { compare(sgd(), GetParam(), {}); }
TEST_P(Zero, AdamWMatchesDdp) { compare(adamw(), GetParam(), {}); }
TEST_P(Zero, AdamWWithScalerClippingAndNoSyncMatchesDdp) {
  compare(adamw(), GetParam(), {.scaler = true, .clip = true, .accumulate = true});
}
TEST_P(Zero, SgdWithScalerAndClippingMatchesDdp) {
  compare(sgd(), GetParam(), {.scaler = true, .clip = true});
}
TEST_P(Zero, NoSyncAccumulationMatchesDdp) { compare(sgd(), GetParam(), {.accumulate = true}); }
// PyTorch's habit of accumulating over synced backward passes (slower than no_sync, but the
// same gradient): under ZeRO-2 only the owner holds the first pass's average.
TEST_P(Zero, TwoSyncedBackwardsWithoutZeroGradMatchDdp) {
  compare(sgd(), GetParam(), {.synced_twice = true});
}

INSTANTIATE_TEST_SUITE_P(Stage, Zero, ::testing::Values(1, 2),
                         [](const auto& info) { return "ZeRO" + std::to_string(info.param); });

// One parameter on two or more ranks: under ZeRO-2 the ranks that own nothing have no
// gradient, yet take part in the scaler's found-inf agreement (dist::make_found_inf_agreement)
// as the owner does, and every rank skips the step whose gradient holds an inf.
TEST(ZeroRedundancyOptimizer, RanksOwningNoGradientTakePartInTheScalersAgreement) {
  const auto pg = world();
  if (pg->size() < 2) GTEST_SKIP() << "needs at least 2 ranks";
  auto train = [&](bool zero2) {
    manual_seed(5);
    auto ddp =
        std::make_shared<DistributedDataParallel>(std::make_shared<nn::Linear>(6, 3, false), pg);
    std::unique_ptr<optim::Optimizer> opt;
    if (zero2) {
      auto zero = std::make_unique<ZeroRedundancyOptimizer>(ddp->parameters(), sgd(), pg);
      zero->shard_gradients(*ddp);
      opt = std::move(zero);
    } else {
      opt = sgd()({optim::ParamGroup(ddp->parameters())});
    }
    optim::GradScaler scaler({.init_scale = 256.0}, make_found_inf_agreement(pg));
    for (int step = 0; step < 4; ++step) {
      opt->zero_grad();
      Generator gen(static_cast<uint64_t>(50 + step));
      const Tensor x = randn({12, 6}, kF32, &gen);
      const Tensor y = randint(0, 3, {12}, kI64, &gen);
      scaler.scale(cross_entropy((*ddp)(shard_rows(x, *pg)), shard_rows(y, *pg))).backward();
      const Tensor& g = ddp->parameters().front().grad();
      if (step == 1 && g.defined()) Tensor(g).fill_(std::numeric_limits<float>::infinity());
      scaler.step(*opt);
      scaler.update();
    }
    return std::make_pair(ddp->parameters().front().detach().clone(), scaler.get_scale());
  };
  const auto [expected, expected_scale] = train(false);
  const auto [actual, actual_scale] = train(true);
  expect_same(actual, expected, pg->size());
  EXPECT_EQ(actual_scale, expected_scale);
  EXPECT_EQ(expected_scale, 128.0);  // the inf step backed off once
}

// The PyTorch habit clip_grad_norm_(model.parameters()) under ZeRO-2 would see this rank's
// share of the gradients only, a smaller norm: it is refused, naming the optimizer's clip. A
// gradient of the parameter's own (the next backward, or set by the user) lifts it.
TEST(ZeroRedundancyOptimizer, PlainClipOverAShardedModelIsRefused) {
  const auto pg = world();
  Replica r = sharded(sgd(), pg, 2);
  EXPECT_TRUE(r.ddp->reduces_to_owners());
  EXPECT_FALSE(plain(sgd(), pg).ddp->reduces_to_owners());
  for (int step = 0; step < 2; ++step) {
    Generator gen(static_cast<uint64_t>(70 + step));
    const Tensor x = randn({12, 6}, kF32, &gen);
    const Tensor y = randint(0, 3, {12}, kI64, &gen);
    r.opt->zero_grad();
    cross_entropy((*r.ddp)(shard_rows(x, *pg)), shard_rows(y, *pg)).backward();
    if (pg->size() > 1) {
      EXPECT_EMBER_ERROR(optim::clip_grad_norm_(r.ddp->parameters(), 1.0),
                         "gradient is held by rank");
    } else {
      EXPECT_NO_THROW(optim::clip_grad_norm_(r.ddp->parameters(), 1.0));
    }
    EXPECT_NO_THROW(r.zero->clip_grad_norm_(1.0));
    r.opt->step();
  }
  for (const Tensor& p : r.ddp->parameters()) {
    if (!p.grad().defined()) p.set_grad(zeros_like(p));
  }
  EXPECT_NO_THROW(optim::clip_grad_norm_(r.ddp->parameters(), 1.0));
}

TEST(ZeroRedundancyOptimizer, PartitionIsGreedyBySizeAsPyTorchs) {
  auto pg = world();
  auto model = net(3);  // numels 96, 16, 192, 12, 36, 3
  ZeroRedundancyOptimizer zero(model->parameters(), sgd(), pg);
  // Largest first, each to the emptiest rank (lowest on a tie): recomputed here.
  std::vector<int64_t> load(static_cast<size_t>(pg->size()), 0);
  std::vector<Tensor> params = model->parameters();
  std::vector<size_t> order = {2, 0, 4, 1, 3, 5};
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    EXPECT_EQ(zero.owner(params[i]), static_cast<int>(r)) << "parameter " << i;
    EXPECT_EQ(zero.owner(0, i), static_cast<int>(r));
    load[r] += params[i].numel();
  }
  EXPECT_EQ(zero.shard_numels(), load);
}

TEST(ZeroRedundancyOptimizer, EachRankHoldsItsShardsStateOnly) {
  auto pg = world();
  Replica zero = sharded(adamw(), pg, 1);
  zero.train_step(0, {}, *pg);
  int64_t held = 0;
  optim::Optimizer* local = zero.zero->local_optimizer();
  for (size_t g = 0; local != nullptr && g < local->param_groups().size(); ++g) {
    for (size_t i = 0; i < local->param_groups()[g].params.size(); ++i) {
      for (const auto& [name, buffer] : local->state(g, i).buffers) held += buffer.numel();
    }
  }
  EXPECT_EQ(held, 2 * zero.zero->shard_numels()[static_cast<size_t>(pg->rank())]);
  for (size_t i = 0; i < zero.opt->param_groups()[0].params.size(); ++i) {
    if (zero.zero->owner(0, i) == pg->rank()) {
      EXPECT_EQ(zero.opt->state(0, i).step_count(), 1);
    } else {
      EXPECT_THROW(zero.opt->state(0, i), Error);
    }
  }
}

TEST(ZeroRedundancyOptimizer, RefusesWhatItCannotDoByName) {
  auto pg = world();
  auto model = net(3);
  ZeroRedundancyOptimizer zero(model->parameters(), adamw(), pg);
  Tensor extra = ones({2}).requires_grad_();
  EXPECT_THROW(zero.add_param_group({{extra}}), Error);
  // SGD's state into the AdamW shards: refused by the plain optimizer's check.
  auto other = net(3);
  auto sgd_opt = sgd()({optim::ParamGroup(other->parameters())});
  EXPECT_THROW(zero.load_state_dict(sgd_opt->state_dict()), Error);
  EXPECT_THROW(zero.state_dict(), Error);  // never consolidated
  EXPECT_THROW(zero.consolidate_state_dict(pg->size()), Error);
  EXPECT_FALSE(zero.device_step_refusal().empty());
}

TEST(ZeroRedundancyOptimizer, WorksOnASubgroup) {
  auto pg = world();
  auto ends = pg->size() == 1 ? pg->new_group({0}) : pg->new_group({0, pg->size() - 1});
  if (!ends->is_member()) return;
  Replica reference = plain(sgd(), ends);
  Replica zero = sharded(sgd(), ends, 2);
  for (int step = 0; step < 3; ++step) {
    reference.train_step(step, {.clip = true}, *ends);
    zero.train_step(step, {.clip = true}, *ends);
  }
  expect_same_parameters(zero, reference, ends->size());
}

TEST(ZeroRedundancyOptimizer, ConsolidatedStateIsThePlainOptimizersAndLoadsBothWays) {
  auto pg = world();
  const int to = pg->size() - 1;
  Replica reference = plain(adamw(), pg);
  Replica zero = sharded(adamw(), pg, 2);
  for (int step = 0; step < 3; ++step) {
    reference.train_step(step, {}, *pg);
    zero.train_step(step, {}, *pg);
  }
  zero.zero->consolidate_state_dict(to);
  const optim::StateDict expected = reference.opt->state_dict();
  if (pg->rank() == to) {
    const optim::StateDict got = zero.opt->state_dict();
    EXPECT_EQ(got.scalars, expected.scalars);
    ASSERT_EQ(got.tensors.size(), expected.tensors.size());
    for (const auto& [key, t] : expected.tensors) {
      SCOPED_TRACE(key);
      ASSERT_EQ(got.tensors.count(key), 1u);
      expect_same(got.tensors.at(key), t, pg->size());
    }
    // ZeRO -> plain: a fresh plain optimizer takes the consolidated state whole.
    auto model = net(3);
    std::unique_ptr<optim::Optimizer> back = adamw()({optim::ParamGroup(model->parameters())});
    back->load_state_dict(got);
    const optim::StateDict again = back->state_dict();
    EXPECT_EQ(again.scalars, expected.scalars);
    for (const auto& [key, t] : expected.tensors) expect_same(again.tensors.at(key), t, pg->size());
  } else {
    EXPECT_THROW(zero.opt->state_dict(), Error);
  }
  // A step after the consolidation makes it stale.
  reference.train_step(3, {}, *pg);
  zero.train_step(3, {}, *pg);
  if (pg->rank() == to) {
    EXPECT_THROW(zero.opt->state_dict(), Error);
  }

  // DDP -> ZeRO: a fresh ZeRO over the reference's current parameters takes the plain state
  // and then trains as the plain optimizer does.
  Replica resumed = sharded(adamw(), pg, 1);
  {
    NoGradGuard no_grad;
    const auto src = reference.ddp->parameters();
    const auto dst = resumed.ddp->parameters();
    for (size_t i = 0; i < src.size(); ++i) Tensor(dst[i]).copy_(src[i]);
  }
  resumed.opt->load_state_dict(reference.opt->state_dict());
  for (int step = 4; step < 6; ++step) {
    reference.train_step(step, {}, *pg);
    resumed.train_step(step, {}, *pg);
  }
  expect_same_parameters(resumed, reference, pg->size());
}

// Sharded snapshots: the ranks' shard_state_dict()s are the consolidated state split by
// owner, with no gathering; a fresh ZeRO loads its own part alone (owns_state_key) and then
// trains as the plain optimizer does.
TEST(ZeroRedundancyOptimizer, ShardStateDictsSplitThePlainStateAndLoadAlone) {
  auto pg = world();
  Replica reference = plain(adamw(), pg);
  Replica zero = sharded(adamw(), pg, 2);
  for (int step = 0; step < 3; ++step) {
    reference.train_step(step, {}, *pg);
    zero.train_step(step, {}, *pg);
  }
  const optim::StateDict expected = reference.opt->state_dict();
  const optim::StateDict mine = zero.zero->shard_state_dict();
  std::vector<int64_t> owned;  // per expected tensor: 1 where this rank holds it
  for (const auto& [key, t] : expected.tensors) {
    SCOPED_TRACE(key);
    const bool own = zero.zero->owns_state_key(key);
    EXPECT_EQ(mine.tensors.count(key), own ? 1u : 0u);
    if (own) expect_same(mine.tensors.at(key), t, pg->size());
    owned.push_back(own ? 1 : 0);
  }
  if (pg->size() > 1) {
    EXPECT_LT(mine.tensors.size(), expected.tensors.size());
  }
  for (const auto& [key, v] : mine.scalars) {
    ASSERT_EQ(expected.scalars.count(key), 1u) << key;
    EXPECT_EQ(v, expected.scalars.at(key)) << key;
  }
  EXPECT_TRUE(zero.zero->owns_state_key("param_groups.0.lr"));  // no parameter's key
  Tensor counts = from_vector<int64_t>(owned, {static_cast<int64_t>(owned.size())});
  pg->allreduce(counts)->wait();
  for (int64_t c : counts.to_vector<int64_t>()) EXPECT_EQ(c, 1);  // each tensor on one rank

  Replica resumed = sharded(adamw(), pg, 1);
  {
    NoGradGuard no_grad;
    const auto src = reference.ddp->parameters();
    const auto dst = resumed.ddp->parameters();
    for (size_t i = 0; i < src.size(); ++i) Tensor(dst[i]).copy_(src[i]);
  }
  optim::StateDict part;
  part.scalars = expected.scalars;
  for (const auto& [key, t] : expected.tensors)
    if (resumed.zero->owns_state_key(key)) part.tensors[key] = t;
  if (pg->size() > 1) {  // another rank's parameter's state is refused, naming its owner
    optim::StateDict theirs;
    theirs.scalars = expected.scalars;
    for (const auto& [key, t] : expected.tensors) {
      if (!resumed.zero->owns_state_key(key)) {
        theirs.tensors[key] = t;
        break;
      }
    }
    EXPECT_EMBER_ERROR(resumed.zero->load_own_state_dict(theirs), "which rank");
  }
  resumed.zero->load_own_state_dict(std::move(part));
  for (int step = 3; step < 5; ++step) {
    reference.train_step(step, {}, *pg);
    resumed.train_step(step, {}, *pg);
  }
  expect_same_parameters(resumed, reference, pg->size());
}

// Uneven inputs: rank r has 2 + r batches, inside a Join with the DDP and (PyTorch's
// Join([model, optim])) the ZeroRedundancyOptimizer: a rank that ran out keeps stepping its
// shard with the gradients the others clipped and unscaled (the GradScaler's skipped step, at
// the third, skipped by all), so ZeRO-1 ends where DDP + the plain optimizer under a Join end.
TEST(ZeroRedundancyOptimizer, UnevenInputsUnderAJoinMatchDdp) {
  auto pg = world();
  auto train = [&](Replica& r) {
    std::vector<ZeroRedundancyOptimizer*> zeros;
    if (r.zero != nullptr) zeros.push_back(r.zero);
    Join join({r.ddp}, zeros, {});
    for (int step = 0; step < 2 + pg->rank(); ++step)
      r.train_step(step, {.scaler = true, .clip = true}, *pg);
    join.join();
  };
  Replica reference = plain(sgd(), pg);
  train(reference);
  Replica zero = sharded(sgd(), pg, 1);
  train(zero);
  expect_same_parameters(zero, reference, pg->size());
  // ZeRO-2's reduces cannot be shadowed: refused by name.
  Replica zero2 = sharded(sgd(), pg, 2);
  EXPECT_THROW(Join({zero2.ddp}, {zero2.zero}, {}), Error);
}

#if EMBER_WITH_CUDA
// On the GPU (a GPU session runs these): CUDA parameters through MPI, which stages them through
// the host (2 ranks may share one GPU), and through NCCL in a world of one, against DDP + the
// plain optimizer on the GPU (both take the multi-tensor updates there).
TEST(ZeroRedundancyOptimizer, OnTheGpuThroughMpiMatchesDdp) {
  EMBER_REQUIRE_CUDA();
  if (testing::test_backend() != "mpi") GTEST_SKIP() << "the TCP group moves CPU tensors only";
  auto pg = world();
  const Device gpu = cuda_device(pg->local_rank() % cuda::device_count());
  for (int stage : {1, 2}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    compare(adamw(), stage, {.scaler = true, .clip = true, .accumulate = true, .device = gpu}, pg);
  }
}

TEST(ZeroRedundancyOptimizer, OnTheGpuOverNcclMatchesDdp) {
  EMBER_REQUIRE_CUDA();
  auto pg = std::make_shared<NcclProcessGroup>(0, 1, 0, 0, NcclProcessGroup::create_unique_id());
  for (int stage : {1, 2}) {
    SCOPED_TRACE("ZeRO-" + std::to_string(stage));
    compare(sgd(), stage, {.scaler = true, .clip = true, .device = cuda_device(0)}, pg);
  }
}
#endif  // EMBER_WITH_CUDA

}  // namespace
}  // namespace ember::dist

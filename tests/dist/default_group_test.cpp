// Every dist API that takes a group, called without one after init_process_group(), as a
// PyTorch user writes it (DDP(model), convert_sync_batchnorm(model), ...): the default group.
// Before init_process_group() each tells to call it first. Runs at any world size.
#include <sstream>

#include <ember/dist/amp.h>
#include <ember/dist/ddp.h>
#include <ember/dist/metrics.h>
#include <ember/dist/sync_batch_norm.h>
#include <ember/optim/sgd.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using ::ember::testing::expect_close;
using testing::cpu_init;
using testing::expect_same_state;
using testing::shard_rows;

constexpr const char* kNotInitialized =
    "the default process group is not initialized; call init_process_group() first";

std::shared_ptr<nn::Module> mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(6, 3)});
}

std::shared_ptr<nn::Module> bn_mlp(uint64_t seed) {
  manual_seed(seed);
  return std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 6), std::make_shared<nn::BatchNorm1d>(6),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::Linear>(6, 3)});
}

std::pair<Tensor, Tensor> batch(int64_t rows, uint64_t seed) {
  Generator gen(seed);
  Tensor x = randn({rows, 4}, kF32, &gen);
  Tensor y = randint(0, 3, {rows}, kI64, &gen);
  return {x, y};
}

// Trains `ddp` on this rank's share of global batches of 6 per rank and `reference` on the
// whole batch, for `steps` steps of SGD.
void train_side_by_side(nn::Module& ddp, nn::Module& reference, const ProcessGroup& pg, int steps) {
  optim::SGD sgd(ddp.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD ref_sgd(reference.parameters(), {.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < steps; ++step) {
    auto [x, y] = batch(6 * pg.size(), 40 + static_cast<uint64_t>(step));
    ref_sgd.zero_grad();
    cross_entropy(reference(x), y).backward();
    ref_sgd.step();
    sgd.zero_grad();
    cross_entropy(ddp(shard_rows(x, pg)), shard_rows(y, pg)).backward();
    sgd.step();
  }
}

TEST(DefaultGroupOverloads, BeforeInitEachTellsToInitFirst) {
  ASSERT_FALSE(is_initialized());
  auto model = mlp(1);
  EXPECT_EMBER_ERROR(DistributedDataParallel{model},
                     std::string("DistributedDataParallel: ") + kNotInitialized);
  EXPECT_EMBER_ERROR((DistributedDataParallel{model, DDPOptions{.broadcast_buffers = false}}),
                     std::string("DistributedDataParallel: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(average_across_ranks({{"loss", 1.0}}),
                     std::string("average_across_ranks: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(RankZeroLogger{}, std::string("RankZeroLogger: ") + kNotInitialized);
  EXPECT_EMBER_ERROR(make_found_inf_agreement(),
                     std::string("make_found_inf_agreement: ") + kNotInitialized);
  SyncBatchNorm bn(6);
  EXPECT_EMBER_ERROR(bn.group(), std::string("SyncBatchNorm: ") + kNotInitialized);

  // As PyTorch's: SyncBatchNorm without a group may be made before init_process_group(), and
  // trains on this process's batch while there is no default group.
  auto converted = convert_sync_batchnorm(bn_mlp(1));
  auto reference = bn_mlp(1);
  auto [x, y] = batch(8, 3);
  expect_close((*converted)(x), (*reference)(x), 1e-6, 1e-6);
  expect_same_state(*converted, *reference, 1e-6, 1e-6);  // running statistics alike
}

// DDP(model) after init_process_group(): rank 0's parameters everywhere, gradients averaged
// over the default group, so every rank follows one process on the whole batch.
TEST(DefaultGroupOverloads, DdpOfTheModelTrainsOnTheDefaultGroup) {
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(cpu_init());
  auto ddp = std::make_shared<DistributedDataParallel>(
      mlp(10 + static_cast<uint64_t>(pg->rank())));  // each rank starts elsewhere
  EXPECT_EQ(&ddp->group(), pg.get());
  auto reference = mlp(10);
  train_side_by_side(*ddp, *reference, *pg, 5);
  expect_same_state(ddp->module(), *reference, 1e-5, 1e-6);
  for (const auto& [name, p] : ddp->module().named_parameters()) {
    Tensor first = p.detach().clone();
    broadcast(first, 0);
    EXPECT_TRUE(equal(first, p.detach())) << name;  // bit-identical on every rank
  }

  // With options.
  DistributedDataParallel with_options(mlp(3), DDPOptions{.bucket_cap_bytes = 64});
  EXPECT_EQ(&with_options.group(), pg.get());
}

// convert_sync_batchnorm(model) before init_process_group(), as PyTorch allows; trained under
// DDP(model) its statistics cover the whole global batch: every rank follows one process.
TEST(DefaultGroupOverloads, ConvertSyncBatchnormUsesTheDefaultGroup) {
  auto converted = convert_sync_batchnorm(bn_mlp(4));
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(cpu_init());
  auto* sync = dynamic_cast<SyncBatchNorm*>(converted->named_children()[1].second.get());
  ASSERT_NE(sync, nullptr);
  EXPECT_EQ(sync->group(), pg);
  auto ddp = std::make_shared<DistributedDataParallel>(converted);
  auto reference = bn_mlp(4);
  train_side_by_side(*ddp, *reference, *pg, 4);
  expect_same_state(ddp->module(), *reference, 1e-5, 1e-6);
}

TEST(DefaultGroupOverloads, MetricsAndFoundInfAgreement) {
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(cpu_init());
  const double r = pg->rank(), w = pg->size();
  const auto mean = average_across_ranks({{"loss", r}, {"accuracy", 2 * r + 1}});
  EXPECT_DOUBLE_EQ(mean.at("loss"), (w - 1) / 2);
  EXPECT_DOUBLE_EQ(mean.at("accuracy"), w);
  std::ostringstream out;
  RankZeroLogger log(out);
  log.log("hello");
  EXPECT_EQ(out.str(), pg->rank() == 0 ? "hello\n" : "");

  // The last rank found an inf: after the agreement every rank has.
  const auto agree = make_found_inf_agreement();
  Tensor found = full({1}, pg->rank() == pg->size() - 1 ? 1.0 : 0.0);
  agree(found);
  EXPECT_EQ(found.item<double>(), 1.0);
}

}  // namespace
}  // namespace ember::dist

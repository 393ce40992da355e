// SyncBatchNorm against BatchNorm over the concatenation of every rank's batch, with unequal
// (even empty) per-rank batches; its communication pattern; convert_sync_batchnorm.
#include <ember/dist/sync_batch_norm.h>
#include <ember/tensor/autocast.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using ::ember::testing::expect_close;
using testing::CountingGroup;
using testing::world;

// Rank r holds rows [first(r), first(r + 1)) of the global batch: 3 + 2r rows, none on rank 2.
int64_t rows_of(int r) { return r == 2 ? 0 : 3 + 2 * r; }
int64_t first_row(int r) {
  int64_t n = 0;
  for (int i = 0; i < r; ++i) n += rows_of(i);
  return n;
}

TEST(SyncBatchNorm, MatchesBatchNormOverTheGlobalBatchWithUnequalShares) {
  auto pg = world();
  const int64_t global = first_row(pg->size());
  Generator gen(3);
  const Tensor x_all = randn({global, 3, 2, 2}, kF32, &gen) * 2.0 + 1.0;
  const Tensor dy_all = randn({global, 3, 2, 2}, kF32, &gen);
  const Tensor affine_w = from_vector<float>({0.5f, 1.5f, -1.0f}, {3});
  const Tensor affine_b = from_vector<float>({0.1f, -0.2f, 0.3f}, {3});

  nn::BatchNorm2d reference(3);
  SyncBatchNorm sync(3, pg);
  for (nn::BatchNorm* bn :
       {static_cast<nn::BatchNorm*>(&reference), static_cast<nn::BatchNorm*>(&sync)}) {
    NoGradGuard no_grad;
    bn->weight.copy_(affine_w);
    bn->bias.copy_(affine_b);
  }
  Tensor x_ref = x_all.clone().requires_grad_();
  Tensor y_ref = reference(x_ref);
  (y_ref * dy_all).sum().backward();

  const int64_t begin = first_row(pg->rank()), rows = rows_of(pg->rank());
  Tensor x = x_all.narrow(0, begin, rows).clone().requires_grad_();
  Tensor y = sync(x);
  // The global loss is the sum of the ranks' losses: input gradients match row for row.
  (y * dy_all.narrow(0, begin, rows)).sum().backward();
  expect_close(y, y_ref.narrow(0, begin, rows), 1e-5, 1e-5);
  expect_close(x.grad(), x_ref.grad().narrow(0, begin, rows), 1e-4, 1e-5);
  // Weight and bias gradients are each rank's share: they sum to the global ones.
  for (auto [mine, full] :
       {std::pair{sync.weight, reference.weight}, {sync.bias, reference.bias}}) {
    Tensor total = mine.grad().clone();
    pg->allreduce(total, ReduceOp::kSum)->wait();
    expect_close(total, full.grad(), 1e-4, 1e-5);
  }
  // Running statistics use the global (unbiased) variance.
  expect_close(sync.running_mean, reference.running_mean, 1e-5, 1e-6);
  expect_close(sync.running_var, reference.running_var, 1e-5, 1e-6);
  EXPECT_EQ(sync.num_batches_tracked.item<int64_t>(), 1);
}

// Under bf16 autocast SyncBatchNorm takes the 16-bit activations of the convolutions before it,
// keeps its statistics (and their exchange) in f32 and its parameters and their gradients in
// f32, and returns the input's dtype, as BatchNorm does under autocast.
TEST(SyncBatchNorm, UnderAutocastKeepsItsStatisticsInF32) {
  auto pg = world();
  const int64_t global = first_row(pg->size());
  Generator gen(4);
  const Tensor x_all = (randn({global, 3, 2, 2}, kF32, &gen) * 2.0 + 1.0).to(kBF16);
  nn::BatchNorm2d reference(3);
  Tensor y_ref = reference(x_all.to(kF32));  // the same values, in f32 throughout

  SyncBatchNorm sync(3, pg);
  const int64_t begin = first_row(pg->rank()), rows = rows_of(pg->rank());
  Tensor y;
  {
    AutocastGuard autocast(kCPU, kBF16);
    y = sync(x_all.narrow(0, begin, rows).clone());
  }
  EXPECT_EQ(y.dtype(), kBF16);
  EXPECT_EQ(sync.running_mean.dtype(), kF32);
  expect_close(sync.running_mean, reference.running_mean, 1e-5, 1e-6);
  expect_close(sync.running_var, reference.running_var, 1e-5, 1e-6);
  // One bf16 rounding of the normalised output (2^-8 relative).
  expect_close(y.to(kF32), y_ref.narrow(0, begin, rows), 1e-2, 1e-2);
  y.to(kF32).sum().backward();
  ASSERT_TRUE(sync.weight.grad().defined());
  EXPECT_EQ(sync.weight.grad().dtype(), kF32);
}

// A channels_last activation (model->to(MemoryFormat::ChannelsLast)) stays channels_last
// through SyncBatchNorm, forward and backward, with the NCHW values.
TEST(SyncBatchNorm, KeepsChannelsLast) {
  auto pg = world();
  Generator gen(8 + static_cast<uint64_t>(pg->rank()));
  const Tensor x = randn({2, 3, 4, 5}, kF32, &gen);
  SyncBatchNorm nchw(3, pg), nhwc(3, pg);
  Tensor a = x.clone().requires_grad_();
  Tensor b = x.clone(MemoryFormat::ChannelsLast).requires_grad_();
  Tensor ya = nchw(a), yb = nhwc(b);
  EXPECT_TRUE(yb.is_contiguous(MemoryFormat::ChannelsLast) && !yb.is_contiguous());
  expect_close(yb, ya, 1e-6, 1e-6);
  const Tensor dy = randn({2, 3, 4, 5}, kF32, &gen);
  (ya * dy).sum().backward();
  (yb * dy).sum().backward();
  EXPECT_TRUE(b.grad().is_contiguous(MemoryFormat::ChannelsLast));
  expect_close(b.grad(), a.grad(), 1e-5, 1e-6);
}

// Its backward crosses the ranks: a second backward through its create_graph gradients is an
// ember::Error naming it (PyTorch's SyncBatchNorm has no double backward either). A group of
// one is batch norm, second derivatives included, as in PyTorch.
TEST(SyncBatchNorm, SecondBackwardThroughItsGradientIsRefusedAcrossRanks) {
  auto pg = world();
  SyncBatchNorm bn(2, pg);
  Generator gen(6 + static_cast<uint64_t>(pg->rank()));
  Tensor x = randn({3, 2, 4}, kF32, &gen).requires_grad_();
  const Tensor y = bn(x);
  const Tensor dx = autograd::grad({(y * y * y).sum()}, {x}, {}, std::nullopt, true)[0];
  EXPECT_TRUE(dx.requires_grad());
  if (pg->size() > 1) {
    EXPECT_EMBER_ERROR(autograd::grad({dx.sum()}, {x}),
                       "SyncBatchNormBackward: its gradient has no derivative in ember");
    return;
  }
  nn::BatchNorm1d plain(2);
  const Tensor py = plain(x);
  const Tensor pdx = autograd::grad({(py * py * py).sum()}, {x}, {}, std::nullopt, true)[0];
  expect_close(autograd::grad({dx.sum()}, {x})[0], autograd::grad({pdx.sum()}, {x})[0], 1e-5, 1e-6);
}

TEST(SyncBatchNorm, OneCollectiveEachWayAndNoneInEval) {
  auto counting = std::make_shared<CountingGroup>(world());
  const int expected = counting->size() > 1 ? 1 : 0;
  SyncBatchNorm bn(2, counting);
  Generator gen(5 + static_cast<uint64_t>(counting->rank()));
  Tensor x = randn({3, 2, 4}, kF32, &gen).requires_grad_();
  Tensor y = bn(x);
  EXPECT_EQ(counting->calls, expected);
  y.sum().backward();
  EXPECT_EQ(counting->calls, 2 * expected);

  bn.eval();
  Tensor z = bn(x);
  EXPECT_EQ(counting->calls, 2 * expected);
  nn::BatchNorm1d plain(2);
  plain.load_state_dict(bn.state_dict());
  plain.eval();
  expect_close(z, plain(x), 1e-6, 1e-6);
}

TEST(SyncBatchNorm, ConvertReplacesEveryBatchNormAndSharesItsTensors) {
  auto pg = world();
  auto inner = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(4, 4), std::make_shared<nn::BatchNorm1d>(4)});
  auto net = std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Conv2d>(1, 4, 3), std::make_shared<nn::BatchNorm2d>(4, 1e-3, 0.2),
      std::make_shared<nn::ReLU>(), std::make_shared<nn::AdaptiveAvgPool2d>(Pair{1, 1}),
      std::make_shared<nn::Flatten>(), inner});
  net->eval();
  const auto before = net->state_dict();
  auto converted = convert_sync_batchnorm(net, pg);
  EXPECT_EQ(converted, net);
  int syncs = 0;
  for (auto& [name, m] : net->named_modules()) {
    EXPECT_EQ(dynamic_cast<nn::BatchNorm2d*>(m), nullptr) << name;
    EXPECT_EQ(dynamic_cast<nn::BatchNorm1d*>(m), nullptr) << name;
    if (auto* s = dynamic_cast<SyncBatchNorm*>(m)) {
      ++syncs;
      EXPECT_FALSE(s->is_training()) << name;
    }
  }
  EXPECT_EQ(syncs, 2);
  auto* first = dynamic_cast<SyncBatchNorm*>(net->named_children()[1].second.get());
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->eps(), 1e-3);
  EXPECT_EQ(first->momentum(), 0.2);
  const auto after = net->state_dict();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, before[i].first);
    EXPECT_TRUE(after[i].second.is_same(before[i].second)) << after[i].first;
  }
  // A BatchNorm at the root is itself replaced; a ResNet (submodules looked up by name) runs.
  auto root = convert_sync_batchnorm(std::make_shared<nn::BatchNorm2d>(3), pg);
  EXPECT_NE(std::dynamic_pointer_cast<SyncBatchNorm>(root), nullptr);
  manual_seed(1);
  auto resnet = convert_sync_batchnorm(
      std::make_shared<nn::ResNet>(std::vector<int64_t>{4}, std::vector<int64_t>{1}, 3, 1,
                                   nn::Stem::kCifar),
      pg);
  Generator gen(2);
  EXPECT_EQ((*resnet)(randn({2, 1, 8, 8}, kF32, &gen)).sizes(), (Shape{2, 3}));
  EXPECT_EMBER_ERROR(convert_sync_batchnorm(nullptr, pg), "the module is null");
}

}  // namespace
}  // namespace ember::dist

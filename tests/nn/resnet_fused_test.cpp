// ResNet with fused batch norm + ReLU (the default) against the same model unfused
// (set_fused(false): batch_norm, add and relu one by one): a ResNet-20 trained 20 SGD-momentum
// steps stays equal within rounding in f64, f32, channels_last and bf16 autocast; a BN child
// replaced by another module is always called itself.
#include <cmath>
#include <memory>
#include <optional>

#include "test_util.h"

namespace ember {
namespace {

using ember::testing::expect_close;

struct TrainRun {
  std::vector<double> losses;
  nn::NamedTensors state;  // parameters and buffers after the last step
  Tensor eval_logits;
};

// Trains a seeded ResNet-20 `steps` steps on random 8x8 images (batch 4) in `dtype` (or f32 under
// `autocast_dtype` when given) with SGD momentum, then runs it in eval on a fixed batch.
TrainRun train_resnet20(bool fused, DType dtype, MemoryFormat format, int steps,
                        std::optional<DType> autocast_dtype = std::nullopt) {
  manual_seed(7);
  auto model = nn::resnet20(10, 3);
  model->to(dtype);
  model->to(format);
  model->set_fused(fused);
  EXPECT_EQ(model->fused(), fused);
  optim::SGDOptions options;
  options.lr = 0.05;
  options.momentum = 0.9;
  options.weight_decay = 5e-4;
  optim::SGD optimizer(model->parameters(), options);
  Generator gen(11);
  const Tensor images = normal({4, 3, 8, 8}, 0.0, 1.0, kF64, &gen).to(dtype).contiguous(format);
  const Tensor labels = randint(0, 10, {4}, kI64, &gen);
  TrainRun run;
  for (int step = 0; step < steps; ++step) {
    Generator step_gen(100 + static_cast<uint64_t>(step));
    const Tensor x = normal({4, 3, 8, 8}, 0.0, 1.0, kF64, &step_gen).to(dtype).contiguous(format);
    optimizer.zero_grad();
    Tensor loss;
    {
      std::optional<AutocastGuard> autocast;
      if (autocast_dtype) autocast.emplace(kCPU, *autocast_dtype);
      loss = cross_entropy(model->forward(x), labels);
    }
    loss.backward();
    optimizer.step();
    run.losses.push_back(loss.item<double>());
  }
  run.state = model->state_dict();
  model->eval();
  NoGradGuard no_grad;
  run.eval_logits = model->forward(images);
  return run;
}

void expect_runs_close(const TrainRun& fused, const TrainRun& unfused, double tol) {
  ASSERT_EQ(fused.losses.size(), unfused.losses.size());
  for (size_t i = 0; i < fused.losses.size(); ++i)
    EXPECT_NEAR(fused.losses[i], unfused.losses[i], tol * (1 + std::abs(unfused.losses[i])))
        << "step " << i;
  ASSERT_EQ(fused.state.size(), unfused.state.size());
  for (size_t i = 0; i < fused.state.size(); ++i) {
    SCOPED_TRACE(fused.state[i].first);
    EXPECT_EQ(fused.state[i].first, unfused.state[i].first);
    expect_close(fused.state[i].second, unfused.state[i].second, tol, tol);
  }
  expect_close(fused.eval_logits, unfused.eval_logits, tol, tol);
}

TEST(ResNetFused, TrainsAsUnfusedInF64) {
  expect_runs_close(train_resnet20(true, kF64, MemoryFormat::Contiguous, 20),
                    train_resnet20(false, kF64, MemoryFormat::Contiguous, 20), 1e-10);
}

TEST(ResNetFused, TrainsAsUnfusedInF32) {
  for (MemoryFormat format : {MemoryFormat::Contiguous, MemoryFormat::ChannelsLast}) {
    SCOPED_TRACE(format == MemoryFormat::ChannelsLast ? "channels_last" : "contiguous");
    expect_runs_close(train_resnet20(true, kF32, format, 20),
                      train_resnet20(false, kF32, format, 20), 1e-4);
  }
}

TEST(ResNetFused, TrainsAsUnfusedUnderBf16Autocast) {
  expect_runs_close(train_resnet20(true, kF32, MemoryFormat::Contiguous, 5, kBF16),
                    train_resnet20(false, kF32, MemoryFormat::Contiguous, 5, kBF16), 1e-5);
}

// A BatchNorm2d subclass: not a plain BatchNorm2d, so the block must call it.
class CountingBatchNorm : public nn::BatchNorm2d {
 public:
  explicit CountingBatchNorm(int64_t features) : nn::BatchNorm2d(features) {}
  Tensor forward(const Tensor& input) override {
    ++calls;
    return nn::BatchNorm2d::forward(input) * 0.5;
  }
  int calls = 0;
};

TEST(ResNetFused, ReplacedBatchNormChildIsCalled) {
  manual_seed(3);
  auto model = nn::resnet20(10, 3);
  auto& block = *model->named_children()[2].second->named_children()[0].second;  // layer1.0
  auto bn1 = std::make_shared<CountingBatchNorm>(16), bn2 = std::make_shared<CountingBatchNorm>(16);
  block.replace_module("bn1", bn1);
  block.replace_module("bn2", bn2);
  auto stem = std::make_shared<CountingBatchNorm>(16);
  model->replace_module("bn1", stem);
  const Tensor x = randn({2, 3, 8, 8});
  const Tensor fused = model->forward(x);
  EXPECT_EQ(bn1->calls, 1);
  EXPECT_EQ(bn2->calls, 1);
  EXPECT_EQ(stem->calls, 1);
  model->set_fused(false);
  model->eval();
  const Tensor a = model->forward(x);
  model->set_fused(true);
  const Tensor b = model->forward(x);
  expect_close(b, a, 0.0, 0.0);  // the replaced children ran (their * 0.5 included) both times
  EXPECT_EQ(bn1->calls, 3);
  EXPECT_EQ(fused.sizes(), (Shape{2, 10}));
}

}  // namespace
}  // namespace ember

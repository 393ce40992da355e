// End to end on ember's own stack: a small ResNet learns a synthetic image task with SGD
// (Nesterov), and the run is deterministic for a seed.
#include "test_util.h"

namespace ember {
namespace {

// 1x8x8 images whose class (0..3) is the quadrant holding a bright 3x3 blob, on noise.
std::pair<Tensor, Tensor> make_task(int64_t n, uint64_t seed) {
  Generator gen(seed);
  Tensor images = normal({n, 1, 8, 8}, 0.0, 0.3, kF32, &gen);
  const Tensor labels = randint(0, 4, {n}, kI64, &gen);
  const Tensor offsets = randint(0, 2, {n, 2}, kI64, &gen);
  const auto label = labels.to_vector<int64_t>();
  const auto offset = offsets.to_vector<int64_t>();
  float* pixels = images.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t top = (label[i] / 2) * 4 + offset[2 * i],
                  left = (label[i] % 2) * 4 + offset[2 * i + 1];
    for (int64_t r = top; r < top + 3; ++r) {
      for (int64_t c = left; c < left + 3; ++c) pixels[i * 64 + r * 8 + c] += 1.5f;
    }
  }
  return {images, labels};
}

struct RunResult {
  std::vector<float> losses;
  double test_accuracy = 0;
};

RunResult train(uint64_t seed, int steps) {
  manual_seed(seed);
  auto model = std::make_shared<nn::ResNet>(std::vector<int64_t>{8, 16}, std::vector<int64_t>{1, 1},
                                            4, 1, nn::Stem::kCifar);
  optim::SGDOptions options;
  options.lr = 0.05;
  options.momentum = 0.9;
  options.nesterov = true;
  options.weight_decay = 5e-4;
  optim::SGD optimizer(model->parameters(), options);
  const auto [train_x, train_y] = make_task(512, 1);
  const auto [test_x, test_y] = make_task(256, 2);
  RunResult result;
  const int64_t batch = 32;
  for (int step = 0; step < steps; ++step) {
    const int64_t start = (step * batch) % train_x.size(0);
    const Tensor x = train_x.narrow(0, start, batch), y = train_y.narrow(0, start, batch);
    optimizer.zero_grad();
    const Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    optimizer.step();
    result.losses.push_back(loss.item<float>());
  }
  model->eval();
  NoGradGuard no_grad;
  const Tensor predicted = argmax(model->forward(test_x), 1);
  result.test_accuracy =
      sum(eq(predicted, test_y)).item<double>() / static_cast<double>(test_y.numel());
  return result;
}

TEST(Training, SmallResNetLearnsAndIsDeterministic) {
  const RunResult first = train(7, 80);
  EXPECT_GE(first.test_accuracy, 0.95) << "test accuracy after 80 steps";
  EXPECT_LT(first.losses.back(), 0.5 * first.losses.front());
  const RunResult second = train(7, 80);
  EXPECT_EQ(first.losses, second.losses);  // bit for bit
  EXPECT_EQ(first.test_accuracy, second.test_accuracy);
}

}  // namespace
}  // namespace ember

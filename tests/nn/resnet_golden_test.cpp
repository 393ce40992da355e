// A small ResNet's forward, loss, gradients and batch-norm statistics against PyTorch's
// values (tests/nn/golden/make_resnet_golden.py wrote them with Debian's python3-torch).
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;

json load_golden() {
  const std::filesystem::path path = EMBER_RESNET_GOLDEN;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  return json::parse(in);
}

Tensor tensor_of(const json& j) {
  const Shape shape = j.at("shape").get<Shape>();
  const std::vector<double> data = j.at("data").get<std::vector<double>>();
  return shape.empty() ? from_vector<double>(data).reshape({}) : from_vector<double>(data, shape);
}

std::shared_ptr<nn::ResNet> small_resnet() {
  auto model = std::make_shared<nn::ResNet>(std::vector<int64_t>{4, 8}, std::vector<int64_t>{1, 1},
                                            3, 3, nn::Stem::kCifar);
  model->to(kF64);
  return model;
}

TEST(ResNetGolden, ForwardLossGradientsAndStatisticsMatchPyTorch) {
  const json golden = load_golden();
  auto model = small_resnet();
  nn::NamedTensors state;
  for (const auto& [name, value] : golden.at("state").items())
    state.emplace_back(name, tensor_of(value));
  model->load_state_dict(state);

  Tensor x = tensor_of(golden.at("input"));
  x.requires_grad_();
  const Tensor target = from_vector<int64_t>(golden.at("target").get<std::vector<int64_t>>());
  model->train();
  const Tensor out = model->forward(x);
  testing::expect_close(out, tensor_of(golden.at("train_output")), 1e-9, 1e-12);
  const Tensor loss = cross_entropy(out, target, {.label_smoothing = 0.1});
  EXPECT_NEAR(loss.item<double>(), golden.at("loss").get<double>(), 1e-10);
  loss.backward();
  testing::expect_close(x.grad(), tensor_of(golden.at("input_grad")), 1e-7, 1e-12);
  for (const auto& [name, p] : model->named_parameters()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(p.grad().defined());
    testing::expect_close(p.grad(), tensor_of(golden.at("grads").at(name)), 1e-7, 1e-12);
  }
  for (const auto& [name, b] : model->named_buffers()) {
    if (name.find("running") == std::string::npos) continue;
    SCOPED_TRACE(name);
    testing::expect_close(b, tensor_of(golden.at("running_after").at(name)), 1e-9, 1e-12);
  }
  model->eval();
  NoGradGuard no_grad;
  testing::expect_close(model->forward(x), tensor_of(golden.at("eval_output")), 1e-9, 1e-12);
}

TEST(ResNetGolden, Float32ForwardAgreesWithFloat64) {
  const json golden = load_golden();
  auto model = small_resnet();
  nn::NamedTensors state;
  for (const auto& [name, value] : golden.at("state").items())
    state.emplace_back(name, tensor_of(value));
  model->load_state_dict(state);
  model->to(kF32);
  model->train();
  const Tensor out = model->forward(tensor_of(golden.at("input")).to(kF32));
  testing::expect_close(out.to(kF64), tensor_of(golden.at("train_output")), 1e-4, 1e-5);
}

}  // namespace
}  // namespace ember

// conv2d, batch_norm and pooling on channels_last inputs against PyTorch 1.13's values and
// strides (written by golden/make_channels_last_golden.py): forward, the gradients of
// sum(output * probe), and batch norm's running statistics.
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using nlohmann::json;

const json& golden() {
  static const json data = [] {
    std::ifstream in(EMBER_CHANNELS_LAST_GOLDEN);
    EXPECT_TRUE(in.good()) << "cannot open " << EMBER_CHANNELS_LAST_GOLDEN;
    return json::parse(in);
  }();
  return data;
}

Tensor tensor_of(const json& j, DType dtype) {
  const Shape shape = j.at("shape").get<Shape>();
  return from_vector(j.at("values").get<std::vector<double>>(), shape).to(dtype);
}

void expect_matches(const Tensor& actual, const json& expected, double tol,
                    const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.at("shape").get<Shape>()) << what;
  const std::vector<double> a = actual.to_vector<double>();
  const auto e = expected.at("values").get<std::vector<double>>();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_LE(std::abs(a[i] - e[i]), tol * (1 + std::abs(e[i])))
        << what << " at " << i << ": " << a[i] << " vs " << e[i];
  }
}

using Op = std::function<Tensor(const std::vector<Tensor>&, Tensor&, Tensor&)>;

Op op_named(const std::string& name) {
  if (name == "conv2d") {
    return [](const auto& x, Tensor&, Tensor&) { return conv2d(x[0], x[1], x[2], {2, 1}, {1, 1}); };
  }
  if (name == "batch_norm") {
    return [](const auto& x, Tensor& rm, Tensor& rv) {
      return batch_norm(x[0], x[1], x[2], rm, rv, true, 0.1, 1e-5);
    };
  }
  if (name == "max_pool2d") {
    return [](const auto& x, Tensor&, Tensor&) { return max_pool2d(x[0], {3, 3}, {2, 2}, {1, 1}); };
  }
  if (name == "adaptive_avg_pool2d") {
    return [](const auto& x, Tensor&, Tensor&) { return adaptive_avg_pool2d(x[0], {2, 3}); };
  }
  ADD_FAILURE() << "unknown op " << name;
  return {};
}

TEST(ChannelsLastGolden, MatchesPyTorchValuesAndStrides) {
  const json& cases = golden().at("cases");
  ASSERT_EQ(cases.size(), 8u);
  for (const json& c : cases) {
    const std::string name =
        c.at("name").get<std::string>() + " " + c.at("dtype").get<std::string>();
    SCOPED_TRACE(name);
    const DType dtype = c.at("dtype") == "f64" ? kF64 : kF32;
    const double tol = dtype == kF64 ? 1e-10 : 2e-5;
    std::vector<Tensor> inputs;
    for (const json& j : c.at("inputs")) {
      Tensor t = tensor_of(j, dtype);
      if (t.dim() == 4) t = t.to(MemoryFormat::ChannelsLast);
      inputs.push_back(t.requires_grad_());
    }
    Tensor rm = zeros({inputs[0].size(1)}, dtype), rv = ones({inputs[0].size(1)}, dtype);
    const Tensor out = op_named(c.at("name"))(inputs, rm, rv);
    EXPECT_EQ(out.strides(), c.at("output_strides").get<Shape>());
    expect_matches(out, c.at("output"), tol, "output");
    (out * tensor_of(c.at("probe"), dtype)).sum().backward();
    for (size_t i = 0; i < inputs.size(); ++i) {
      expect_matches(inputs[i].grad(), c.at("grads")[i], tol, "grad " + std::to_string(i));
      EXPECT_EQ(inputs[i].grad().strides(), c.at("grad_strides")[i].get<Shape>()) << i;
    }
    if (c.contains("running_mean")) {
      expect_matches(rm, c.at("running_mean"), tol, "running_mean");
      expect_matches(rv, c.at("running_var"), tol, "running_var");
    }
  }
}

}  // namespace
}  // namespace ember

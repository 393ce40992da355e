// SGD, Adam and AdamW against parameter trajectories recorded from PyTorch 1.13, in float32
// and in float64 (where every option must take part at full double precision).
#include <memory>
#include <optional>

#include <ember/optim/adam.h>
#include <ember/optim/sgd.h>

#include "golden.h"

namespace ember::optim {
namespace {

using nlohmann::json;

// foreach: the multi-tensor update (true), the per-parameter one (false) or the device's default.
std::unique_ptr<Optimizer> make_optimizer(const json& spec, const std::vector<Tensor>& params,
                                          std::optional<bool> foreach) {
  const auto defaults = spec["defaults"].get<Options>();
  std::vector<ParamGroup> groups;
  if (spec["groups"].empty()) {
    groups.emplace_back(params, defaults);
  } else {
    for (size_t i = 0; i < spec["groups"].size(); ++i) {
      Options options = defaults;
      for (const auto& [key, value] : spec["groups"][i].items()) options[key] = value.get<double>();
      groups.emplace_back(std::vector<Tensor>{params[i]}, options);
    }
  }
  const auto name = spec["optimizer"].get<std::string>();
  if (name == "SGD") return std::make_unique<SGD>(groups, SGDOptions{.foreach = foreach});
  if (name == "Adam") return std::make_unique<Adam>(groups, AdamOptions{.foreach = foreach});
  EXPECT_EQ(name, "AdamW");
  return std::make_unique<AdamW>(groups, AdamWOptions{.foreach = foreach});
}

// grad = p*p - 0.5*p + 0.3, in the script's order of float32 operations.
void set_golden_grads(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    const Tensor d = p.detach();
    p.set_grad(add(sub(mul(d, d), mul(d, 0.5)), 0.3));
  }
}

std::vector<Tensor> golden_params(Device device, DType dtype) {
  const json& golden = testing::optim_golden();
  std::vector<Tensor> params;
  for (size_t k = 0; k < golden["initial"].size(); ++k) {
    // f32 parameters start from the JSON's doubles rounded to float, as torch.tensor does.
    const auto values = golden["initial"][k].get<std::vector<double>>();
    Tensor p = dtype == kF64 ? from_vector(values, golden["shapes"][k].get<Shape>(), device)
                             : from_vector(std::vector<float>(values.begin(), values.end()),
                                           golden["shapes"][k].get<Shape>(), device);
    p.requires_grad_();
    params.push_back(p);
  }
  return params;
}

// f32 trajectories agree to float rounding; f64 ones to a few double roundings (PyTorch fuses
// some multiply-adds that ember rounds twice), far below the 1e-9..4e-7 an option rounded
// through float32 costs.
void check_all_cases(Device device, DType dtype, std::optional<bool> foreach = std::nullopt) {
  const json& golden = testing::optim_golden();
  const json& cases = golden[dtype == kF64 ? "optimizers_f64" : "optimizers"];
  const double rtol = dtype == kF64 ? 1e-13 : 1e-5, atol = dtype == kF64 ? 1e-15 : 1e-7;
  ASSERT_GE(cases.size(), 8u);
  for (const json& spec : cases) {
    SCOPED_TRACE(spec["name"].get<std::string>());
    const std::vector<Tensor> params = golden_params(device, dtype);
    auto optimizer = make_optimizer(spec, params, foreach);
    const json& trajectory = spec["trajectory"];
    for (size_t step = 0; step < trajectory.size(); ++step) {
      set_golden_grads(params);
      optimizer->step();
      for (size_t k = 0; k < params.size(); ++k) {
        testing::expect_values_near(
            params[k].to_vector<double>(), trajectory[step][k].get<std::vector<double>>(), rtol,
            atol, "step " + std::to_string(step + 1) + " param " + std::to_string(k));
      }
    }
  }
}

TEST(OptimizerGolden, MatchesPyTorchOnCpu) { check_all_cases(kCPU, kF32); }
TEST(OptimizerGolden, MatchesPyTorchInFloat64OnCpu) { check_all_cases(kCPU, kF64); }

TEST(OptimizerGolden, MultiTensorMatchesPyTorchOnCpu) { check_all_cases(kCPU, kF32, true); }
TEST(OptimizerGolden, MultiTensorMatchesPyTorchInFloat64OnCpu) {
  check_all_cases(kCPU, kF64, true);
}

TEST(OptimizerGolden, MatchesPyTorchOnCuda) {
  EMBER_REQUIRE_CUDA();
  check_all_cases(cuda_device(0), kF32);
}

TEST(OptimizerGolden, MatchesPyTorchInFloat64OnCuda) {
  EMBER_REQUIRE_CUDA();
  check_all_cases(cuda_device(0), kF64);
}

// The CUDA default is the multi-tensor update; these pin the per-parameter path there.
TEST(OptimizerGolden, PerParameterMatchesPyTorchOnCuda) {
  EMBER_REQUIRE_CUDA();
  check_all_cases(cuda_device(0), kF32, false);
  check_all_cases(cuda_device(0), kF64, false);
}

}  // namespace
}  // namespace ember::optim

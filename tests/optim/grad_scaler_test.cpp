// GradScaler against PyTorch's (golden/make_grad_scaler_golden.py) and its rules by hand.
#include <cmath>
#include <limits>

#include <ember/optim/clip_grad.h>
#include <ember/optim/grad_scaler.h>
#include <ember/optim/sgd.h>

#include "golden.h"

namespace ember::optim {
namespace {

using nlohmann::json;

const json& scaler_golden() {
  static const json golden = testing::read_golden(EMBER_GRAD_SCALER_GOLDEN);
  return golden;
}

Tensor tensor_of(const json& rows) {
  std::vector<double> flat;
  for (const json& row : rows) {
    for (const json& v : row) flat.push_back(v.get<double>());
  }
  return from_vector(flat,
                     {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())})
      .to(kF32);
}

double value_of(const std::string& s) {
  if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  return s == "-inf" ? -std::numeric_limits<double>::infinity()
                     : std::numeric_limits<double>::infinity();
}

// The golden run: y = x W^T + b, mean squared error, SGD(lr, momentum), injected inf/NaN.
void check_case(const std::string& name, Device device) {
  SCOPED_TRACE(name + " on " + device.str());
  const json& g = scaler_golden();
  const json& c = g["cases"][name];
  const Tensor x = tensor_of(g["x"]).to(device), t = tensor_of(g["t"]).to(device);
  Tensor weight = tensor_of(g["weight0"]).to(device);
  Tensor bias = from_vector(g["bias0"].get<std::vector<double>>()).to(kF32).to(device);
  weight.requires_grad_();
  bias.requires_grad_();
  SGD opt({weight, bias}, {.lr = g["lr"].get<double>(), .momentum = g["momentum"].get<double>()});
  GradScalerOptions options;
  if (c["options"].contains("init_scale")) options.init_scale = c["options"]["init_scale"];
  if (c["options"].contains("growth_interval")) {
    options.growth_interval = c["options"]["growth_interval"];
  }
  GradScaler scaler(options);
  EXPECT_EQ(scaler.get_scale(), options.init_scale);
  for (int step = 0; step < c["steps"].get<int>(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    opt.zero_grad();
    const Tensor loss = mean(pow(sub(add(matmul(x, weight.t()), bias), t), 2));
    EXPECT_NEAR(loss.item<double>(), c["losses"][step].get<double>(), 1e-5);
    scaler.scale(loss).backward();
    const std::string key = std::to_string(step);
    if (c["inject"].contains(key)) {
      const json& inj = c["inject"][key];
      Tensor& p = inj[0] == "weight" ? weight : bias;
      Tensor grad = p.grad().cpu().contiguous();
      grad.data_ptr<float>()[inj[1].get<int>()] =
          static_cast<float>(value_of(inj[2].get<std::string>()));
      Tensor(p.grad()).copy_(grad.view(p.sizes()));
    }
    if (!c["clip"].is_null()) {
      scaler.unscale_(opt);
      clip_grad_norm_({weight, bias}, c["clip"].get<double>());
    }
    const bool ran = scaler.step(opt);
    EXPECT_EQ(!ran, c["skipped"][step].get<bool>());
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), c["scales"][step].get<double>());
  }
  testing::expect_values_near(weight.to_vector<double>(), c["weight"].get<std::vector<double>>(),
                              1e-5, 1e-6, "weight");
  testing::expect_values_near(bias.to_vector<double>(), c["bias"].get<std::vector<double>>(), 1e-5,
                              1e-6, "bias");
  const StateDict state = scaler.state_dict();
  for (const auto& [k, v] : c["state_dict"].items()) {
    ASSERT_TRUE(state.scalars.count(k)) << k;
    EXPECT_EQ(state.scalars.at(k), v.get<double>()) << k;
  }
  EXPECT_EQ(state.scalars.size(), c["state_dict"].size());
}

TEST(GradScaler, MatchesPyTorchGrowthAndBackoff) { check_case("growth_and_backoff", kCPU); }
TEST(GradScaler, MatchesPyTorchWithDefaults) { check_case("defaults", kCPU); }
TEST(GradScaler, UnscaleThenClipMatchesPyTorch) { check_case("unscale_then_clip", kCPU); }

TEST(GradScaler, MatchesPyTorchOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_case("growth_and_backoff", cuda_device());
  check_case("unscale_then_clip", cuda_device());
}

struct Quadratic {
  Tensor w = from_vector(std::vector<float>{1.f, -2.f, 3.f}).requires_grad_();
  SGD opt{{w}, {.lr = 0.1}};
  Tensor loss() const { return sum(mul(w, w)); }  // gradient 2w
  // One scaled iteration: zero_grad, scaled backward, step, update. Whether the step ran.
  bool iteration(GradScaler& scaler) {
    opt.zero_grad();
    scaler.scale(loss()).backward();
    const bool ran = scaler.step(opt);
    scaler.update();
    return ran;
  }
};

TEST(GradScaler, ScaleMultipliesTheLossAndGradientsComeBackUnscaled) {
  Quadratic q;
  GradScaler scaler({.init_scale = 8.0});
  const Tensor scaled = scaler.scale(q.loss());
  EXPECT_EQ(scaled.dim(), 0);
  EXPECT_FLOAT_EQ(scaled.item<float>(), 8.f * 14.f);
  scaled.backward();
  EXPECT_EQ(q.w.grad().to_vector<float>(), (std::vector<float>{16.f, -32.f, 48.f}));
  scaler.unscale_(q.opt);
  EXPECT_EQ(q.w.grad().to_vector<float>(), (std::vector<float>{2.f, -4.f, 6.f}));
  EXPECT_TRUE(scaler.step(q.opt));
  EXPECT_EQ(q.w.to_vector<float>(), (std::vector<float>{0.8f, -1.6f, 2.4f}));
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 8.0);
  EXPECT_EQ(scaler.get_growth_tracker(), 1);
}

TEST(GradScaler, UnscaleThenClipEqualsClipOfTheTrueGradients) {
  Quadratic a, b;
  GradScaler scaler({.init_scale = 1024.0});
  scaler.scale(a.loss()).backward();
  scaler.unscale_(a.opt);
  const double norm_a = clip_grad_norm_({a.w}, 1.0).item<double>();
  b.loss().backward();
  const double norm_b = clip_grad_norm_({b.w}, 1.0).item<double>();
  EXPECT_DOUBLE_EQ(norm_a, norm_b);
  EXPECT_EQ(a.w.grad().to_vector<float>(), b.w.grad().to_vector<float>());
}

TEST(GradScaler, ANonFiniteGradientSkipsTheStepAndHalvesTheScale) {
  for (const float bad :
       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN()}) {
    Quadratic q;
    GradScaler scaler;
    scaler.scale(q.loss()).backward();
    Tensor(q.w.grad()).fill_(bad);
    EXPECT_FALSE(scaler.step(q.opt));
    EXPECT_EQ(q.w.to_vector<float>(), (std::vector<float>{1.f, -2.f, 3.f}));
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), 32768.0);
    EXPECT_EQ(scaler.get_growth_tracker(), 0);
  }
}

TEST(GradScaler, GrowsAfterTheIntervalOfCleanSteps) {
  Quadratic q;
  GradScaler scaler({.init_scale = 4.0, .growth_factor = 3.0, .growth_interval = 4});
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(q.iteration(scaler));
    EXPECT_EQ(scaler.get_scale(), i < 3 ? 4.0 : (i < 7 ? 12.0 : 36.0)) << "after step " << i;
  }
}

TEST(GradScaler, GrowthStopsShortOfInfinity) {
  Quadratic q;
  GradScaler scaler({.init_scale = 3e38, .growth_interval = 1});
  scaler.scale(q.loss());
  q.w.set_grad(zeros({3}));  // finite: the scale would grow
  scaler.step(q.opt);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), static_cast<double>(3e38f));  // 6e38 overflows f32: kept
}

TEST(GradScaler, EnforcesTheOrderOfCallsAsPyTorch) {
  Quadratic q;
  GradScaler scaler;
  EXPECT_EMBER_ERROR(scaler.unscale_(q.opt), "call scaler.scale(loss)");
  EXPECT_EMBER_ERROR(scaler.update(), "call scaler.scale(loss)");
  {
    GradScaler no_backward;
    no_backward.scale(q.loss());  // backward never ran: no gradient to check
    EXPECT_EMBER_ERROR(no_backward.step(q.opt), "no inf checks were recorded for this optimizer");
  }
  scaler.scale(q.loss()).backward();
  EXPECT_EMBER_ERROR(scaler.update(), "no inf checks were recorded");
  scaler.unscale_(q.opt);
  EXPECT_EMBER_ERROR(scaler.unscale_(q.opt), "already been called");
  scaler.step(q.opt);
  EXPECT_EMBER_ERROR(scaler.unscale_(q.opt), "after step()");
  EXPECT_EMBER_ERROR(scaler.step(q.opt), "step() has already been called");
  scaler.update();
  scaler.unscale_(q.opt);  // a new iteration
}

TEST(GradScaler, RefusesF16GradientsAndBadOptions) {
  Tensor w = ones({2}, kF16);
  w.requires_grad_();
  SGD opt({w}, {.lr = 0.1});
  GradScaler scaler;
  scaler.scale(sum(w.to(kF32))).backward();
  EXPECT_EMBER_ERROR(scaler.unscale_(opt), "f16 gradients");
  EXPECT_EMBER_ERROR(GradScaler({.growth_factor = 1.0}), "growth_factor must be > 1, got 1");
  EXPECT_EMBER_ERROR(GradScaler({.backoff_factor = 1.5}), "backoff_factor must be in (0, 1)");
  EXPECT_EMBER_ERROR(GradScaler({.growth_interval = 0}), "growth_interval must be positive");
  EXPECT_EMBER_ERROR(GradScaler({.init_scale = -1}), "init_scale must be positive");
  EXPECT_EMBER_ERROR(scaler.update(0.0), "new_scale must be positive");
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Quadratic q;
  GradScaler scaler({.enabled = false});
  const Tensor loss = q.loss();
  const Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.item<float>(), loss.item<float>());
  scaled.backward();
  Tensor(q.w.grad()).fill_(std::numeric_limits<float>::infinity());
  EXPECT_TRUE(scaler.step(q.opt));  // no checks: the step runs, as PyTorch's
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1.0);
  EXPECT_TRUE(scaler.state_dict().scalars.empty());
}

TEST(GradScaler, WithBf16AutocastStyleLossItIsHarmless) {
  // A bf16 loss (as autocast may produce) scales in f32 and the true gradient comes back.
  Quadratic q;
  GradScaler scaler;
  const Tensor loss = q.loss().to(kBF16);
  const Tensor scaled = scaler.scale(loss);
  EXPECT_EQ(scaled.dtype(), kF32);
  scaled.backward();
  EXPECT_TRUE(scaler.step(q.opt));
  EXPECT_EQ(q.w.to_vector<float>(), (std::vector<float>{0.8f, -1.6f, 2.4f}));
}

TEST(GradScaler, StateDictRoundTripsIntoANewScaler) {
  Quadratic q;
  GradScaler a({.init_scale = 64.0, .growth_interval = 5});
  for (int i = 0; i < 3; ++i) q.iteration(a);
  q.opt.zero_grad();
  a.scale(q.loss()).backward();
  Tensor(q.w.grad()).fill_(std::numeric_limits<float>::quiet_NaN());
  a.step(q.opt);
  a.update();
  q.iteration(a);
  const StateDict saved = a.state_dict();
  EXPECT_EQ(saved.scalars.at("scale"), 32.0);
  EXPECT_EQ(saved.scalars.at("_growth_tracker"), 1.0);

  GradScaler b;  // defaults, then restored: continues exactly where a stopped
  b.load_state_dict(saved);
  EXPECT_EQ(b.get_scale(), 32.0);
  EXPECT_EQ(b.get_growth_interval(), 5);
  for (int i = 0; i < 4; ++i) {
    for (GradScaler* s : {&a, &b}) q.iteration(*s);
    EXPECT_EQ(a.get_scale(), b.get_scale());
    EXPECT_EQ(a.get_growth_tracker(), b.get_growth_tracker());
  }
  EXPECT_EQ(b.get_scale(), 64.0);
  EXPECT_EMBER_ERROR(b.load_state_dict({}), "disabled GradScaler");
  StateDict partial = saved;
  partial.scalars.erase("growth_interval");
  EXPECT_EMBER_ERROR(b.load_state_dict(partial), "missing key \"growth_interval\"");
}

TEST(GradScaler, TheReducerSeesEveryFoundInfAndCanForceASkip) {
  // What DDP's agreement does: another rank found an inf, so this one skips too.
  Quadratic q;
  int calls = 0;
  GradScaler scaler({}, [&](const Tensor& found_inf) {
    ++calls;
    EXPECT_EQ(found_inf.item<float>(), 0.f);  // this rank's gradients are finite
    Tensor(found_inf).fill_(1.f);
  });
  scaler.scale(q.loss()).backward();
  EXPECT_FALSE(scaler.step(q.opt));
  EXPECT_EQ(calls, 1);
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

}  // namespace
}  // namespace ember::optim

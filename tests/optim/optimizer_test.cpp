// What every optimizer shares: param groups, zero_grad, state_dict round trips, input checks.
#include <memory>

#include <ember/optim/adam.h>
#include <ember/optim/sgd.h>

#include "test_util.h"

namespace ember::optim {
namespace {

Tensor leaf(std::vector<float> values, Device device = kCPU) {
  Tensor p = from_vector(values, {}, device);
  p.requires_grad_();
  return p;
}

// Deterministic gradients that change every step: g = sin-free p*p - 0.5*p + 0.3 + 0.1*step.
void set_grads(const std::vector<Tensor>& params, int step) {
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    const Tensor d = p.detach();
    p.set_grad(add(sub(mul(d, d), mul(d, 0.5)), 0.3 + 0.1 * step));
  }
}

std::vector<Tensor> fresh_params(Device device = kCPU) {
  return {leaf({0.5f, -0.3f, 0.8f, 1.2f}, device), leaf({0.9f, -0.6f}, device),
          leaf({1.5f}, device)};
}

std::vector<ParamGroup> two_groups(const std::vector<Tensor>& params) {
  return {ParamGroup({params[0], params[1]}), ParamGroup({params[2]}, {{"lr", 0.003}})};
}

TEST(Optimizer, GroupsUseTheirOwnOptions) {
  Tensor a = leaf({1.0f});
  Tensor b = leaf({1.0f});
  SGD sgd({ParamGroup({a}), ParamGroup({b}, {{"lr", 0.01}})}, {.lr = 0.1, .momentum = 0.9});
  ASSERT_EQ(sgd.param_groups().size(), 2u);
  // Options a group leaves out come from the defaults.
  EXPECT_DOUBLE_EQ(sgd.param_groups()[1].option("momentum"), 0.9);
  EXPECT_DOUBLE_EQ(sgd.param_groups()[1].lr(), 0.01);
  a.set_grad(ones({1}));
  b.set_grad(ones({1}));
  sgd.step();
  EXPECT_NEAR(a.item<double>(), 0.9, 1e-7);
  EXPECT_NEAR(b.item<double>(), 0.99, 1e-7);
  // Editing a group's lr takes effect on the next step.
  sgd.param_groups()[0].set_lr(1.0);
  sgd.step();
  EXPECT_NEAR(a.item<double>(), 0.9 - 1.0 * 1.9, 1e-6);
  EXPECT_EMBER_ERROR(sgd.param_groups()[0].option("beta1"), "no option named \"beta1\"");

  // add_param_group after construction.
  Tensor c = leaf({2.0f});
  sgd.add_param_group({{c}, {{"lr", 0.5}, {"momentum", 0.0}}});
  c.set_grad(ones({1}));
  sgd.step();
  EXPECT_NEAR(c.item<double>(), 1.5, 1e-7);
  EXPECT_TRUE(sgd.state(2, 0).empty());
}

TEST(Optimizer, ZeroGradSetToNoneOrZeroes) {
  Tensor a = leaf({1.0f, 2.0f});
  Tensor b = leaf({3.0f});
  SGD sgd({a, b}, {.lr = 0.1});
  a.set_grad(from_vector<float>({5.0f, 6.0f}));
  b.set_grad(from_vector<float>({7.0f}));
  const void* storage = a.grad().data_ptr();
  sgd.zero_grad(false);
  ASSERT_TRUE(a.grad().defined());
  EXPECT_EQ(a.grad().data_ptr(), storage);  // zeroed in place, not replaced
  testing::expect_close(a.grad(), zeros({2}));
  testing::expect_close(b.grad(), zeros({1}));
  sgd.zero_grad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  sgd.zero_grad(false);  // nothing to zero: stays undefined
  EXPECT_FALSE(a.grad().defined());
  // With no gradient a step changes nothing.
  sgd.step();
  EXPECT_FLOAT_EQ(b.item<float>(), 3.0f);
}

// Runs `make` on fresh parameters for `total` steps, or for `split` steps, then saves and
// restores into a second optimizer (built with different options), and runs the rest.
template <typename Make>
void expect_resume_is_exact(Make make, int split, int total) {
  auto params = fresh_params();
  auto uninterrupted = make(params, 1.0);
  for (int s = 0; s < total; ++s) {
    set_grads(params, s);
    uninterrupted->step();
  }

  auto first = fresh_params();
  auto before = make(first, 1.0);
  for (int s = 0; s < split; ++s) {
    set_grads(first, s);
    before->step();
  }
  StateDict dict = before->state_dict();
  // A checkpoint round trip: the dict must not alias the live state.
  for (auto& [key, tensor] : dict.tensors) tensor = tensor.clone();

  auto second = fresh_params();
  {
    NoGradGuard no_grad;
    for (size_t k = 0; k < second.size(); ++k) second[k].copy_(first[k]);
  }
  auto after = make(second, 7.0);  // different lrs: load_state_dict restores the saved ones
  after->load_state_dict(dict);
  EXPECT_DOUBLE_EQ(after->param_groups()[1].lr(), before->param_groups()[1].lr());
  for (int s = split; s < total; ++s) {
    set_grads(second, s);
    after->step();
  }
  for (size_t k = 0; k < params.size(); ++k)
    EXPECT_TRUE(equal(second[k].detach(), params[k].detach())) << "param " << k;
  EXPECT_EQ(after->state(0, 0).step, uninterrupted->state(0, 0).step);
}

TEST(Optimizer, StateDictRoundTripContinuesExactly) {
  expect_resume_is_exact(
      [](const std::vector<Tensor>& p, double scale) {
        return std::make_unique<SGD>(
            two_groups(p), SGDOptions{.lr = 0.05 * scale, .momentum = 0.9, .nesterov = true});
      },
      3, 8);
  expect_resume_is_exact(
      [](const std::vector<Tensor>& p, double scale) {
        return std::make_unique<Adam>(two_groups(p),
                                      AdamOptions{.lr = 0.01 * scale, .amsgrad = true});
      },
      4, 9);
  expect_resume_is_exact(
      [](const std::vector<Tensor>& p, double scale) {
        return std::make_unique<AdamW>(two_groups(p), AdamWOptions{.lr = 0.02 * scale});
      },
      2, 6);
}

TEST(Optimizer, StateDictLayout) {
  auto params = fresh_params();
  Adam adam(two_groups(params), {.lr = 0.01});
  // Only parameters that have been updated have state.
  params[2].set_grad(ones({1}));
  adam.step();
  const StateDict dict = adam.state_dict();
  EXPECT_DOUBLE_EQ(dict.scalars.at("param_groups.0.num_params"), 2.0);
  EXPECT_DOUBLE_EQ(dict.scalars.at("param_groups.1.num_params"), 1.0);
  EXPECT_DOUBLE_EQ(dict.scalars.at("param_groups.0.lr"), 0.01);
  EXPECT_DOUBLE_EQ(dict.scalars.at("param_groups.1.lr"), 0.003);
  EXPECT_DOUBLE_EQ(dict.scalars.at("param_groups.1.beta2"), 0.999);
  EXPECT_DOUBLE_EQ(dict.scalars.at("state.2.step"), 1.0);
  EXPECT_EQ(dict.scalars.count("state.0.step"), 0u);
  ASSERT_EQ(dict.tensors.size(), 2u);
  EXPECT_EQ(dict.tensors.at("state.2.exp_avg").sizes(), Shape({1}));
  EXPECT_EQ(dict.tensors.count("state.2.exp_avg_sq"), 1u);
}

TEST(Optimizer, LoadStateDictRejectsMismatches) {
  auto params = fresh_params();
  SGD sgd(two_groups(params), {.lr = 0.1, .momentum = 0.9});
  set_grads(params, 0);
  sgd.step();
  const StateDict good = sgd.state_dict();

  auto other = fresh_params();
  SGD one_group(other, {.lr = 0.1, .momentum = 0.9});
  EXPECT_EMBER_ERROR(
      one_group.load_state_dict(good),
      "SGD: load_state_dict: the state dict has 2 param groups but the optimizer has 1");
  SGD target(two_groups(fresh_params()), {.lr = 0.5, .momentum = 0.9});
  StateDict wrong_shape = good;
  wrong_shape.tensors["state.1.momentum_buffer"] = zeros({3});
  EXPECT_EMBER_ERROR(target.load_state_dict(wrong_shape),
                     "\"state.1.momentum_buffer\" has shape [3] but parameter 1 has shape [2]");
  StateDict too_many = good;
  too_many.tensors["state.3.momentum_buffer"] = zeros({1});
  EXPECT_EMBER_ERROR(target.load_state_dict(too_many), "state for parameter 3");
  StateDict wrong_count = good;
  wrong_count.scalars["param_groups.1.num_params"] = 2;
  EXPECT_EMBER_ERROR(target.load_state_dict(wrong_count),
                     "group 1 has 1 parameters but the state dict has 2");
  const auto without = [&](const std::string& prefix) {
    StateDict dict = good;
    std::erase_if(dict.scalars, [&](const auto& kv) { return kv.first.starts_with(prefix); });
    return dict;
  };
  EXPECT_EMBER_ERROR(target.load_state_dict(without("param_groups.1.")),
                     "the state dict has 1 param groups but the optimizer has 2");
  EXPECT_EMBER_ERROR(target.load_state_dict(without("param_groups.0.")),
                     "the state dict has no group 0");
  EXPECT_EMBER_ERROR(target.load_state_dict(without("param_groups.0.momentum")),
                     "group 0 lacks option \"momentum\"");
  StateDict bad_value = good;
  bad_value.scalars["param_groups.0.lr"] = -1;
  EXPECT_EMBER_ERROR(target.load_state_dict(bad_value), "SGD: invalid learning rate -1");
  StateDict junk = good;
  junk.scalars["epoch"] = 3;
  EXPECT_EMBER_ERROR(target.load_state_dict(junk), "unexpected scalar \"epoch\"");
  // An Adam dict does not fit an SGD: refused by name, or (without its type key) by content.
  auto adam_params = fresh_params();
  Adam adam(two_groups(adam_params), {});
  EXPECT_EMBER_ERROR(target.load_state_dict(adam.state_dict()),
                     "SGD: load_state_dict: the state is from Adam, not SGD");
  StateDict untyped = adam.state_dict();
  untyped.scalars.erase("type.Adam");
  EXPECT_EMBER_ERROR(target.load_state_dict(untyped), "SGD: load_state_dict: unknown option");
  // Nothing changed after the failures.
  EXPECT_DOUBLE_EQ(target.param_groups()[0].lr(), 0.5);
  EXPECT_TRUE(target.state(0, 0).empty());
  target.load_state_dict(good);
  EXPECT_DOUBLE_EQ(target.param_groups()[0].lr(), 0.1);
  EXPECT_TRUE(equal(target.state(0, 1).buffers.at("momentum_buffer"),
                    sgd.state(0, 1).buffers.at("momentum_buffer")));
  EXPECT_FALSE(target.state(0, 1)
                   .buffers.at("momentum_buffer")
                   .is_same(sgd.state(0, 1).buffers.at("momentum_buffer")));
}

TEST(Optimizer, RejectsBadParameters) {
  Tensor a = leaf({1.0f});
  Tensor frozen = from_vector<float>({1.0f, 2.0f});
  EXPECT_EMBER_ERROR(SGD({a, frozen}, {.lr = 0.1}),
                     "SGD: parameter 1 of the new group (shape [2]) does not require grad");
  EXPECT_EMBER_ERROR(Adam({a, a}, {}),
                     "Adam: parameter 1 of the new group (shape [1]) appears twice");
  Tensor non_leaf = mul(a, 2.0);
  EXPECT_EMBER_ERROR(AdamW({non_leaf}, {}), "is not a leaf");
  Tensor integer = from_vector<int64_t>({1});
  EXPECT_EMBER_ERROR(SGD({integer}, {.lr = 0.1}), "only floating-point tensors");
  EXPECT_EMBER_ERROR(SGD({Tensor()}, {.lr = 0.1}), "parameter 0 of the new group is undefined");
  SGD sgd({a}, {.lr = 0.1});
  Tensor b = leaf({2.0f});
  EXPECT_EMBER_ERROR(
      sgd.add_param_group({{b, a}}),
      "SGD: parameter 1 of the new group (shape [1]) is already parameter 0 of group 0");
  EXPECT_EMBER_ERROR(sgd.add_param_group({std::vector<Tensor>{}}),
                     "a parameter group needs at least one parameter");
  EXPECT_EQ(sgd.param_groups().size(), 1u);
  EXPECT_EMBER_ERROR(sgd.state(1, 0), "no parameter 0 in group 1");
}

TEST(Optimizer, CudaMatchesCpu) {
  EMBER_REQUIRE_CUDA();
  const auto make = [](const std::vector<Tensor>& p) -> std::vector<std::unique_ptr<Optimizer>> {
    std::vector<std::unique_ptr<Optimizer>> out;
    out.push_back(std::make_unique<SGD>(
        std::vector<Tensor>{p[0]},
        SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-2, .nesterov = true}));
    out.push_back(std::make_unique<Adam>(std::vector<Tensor>{p[1]},
                                         AdamOptions{.weight_decay = 0.1, .amsgrad = true}));
    out.push_back(std::make_unique<AdamW>(std::vector<Tensor>{p[2]}, AdamWOptions{.lr = 0.1}));
    return out;
  };
  auto cpu = fresh_params();
  auto gpu = fresh_params(cuda_device(0));
  auto cpu_opts = make(cpu);
  auto gpu_opts = make(gpu);
  for (int s = 0; s < 5; ++s) {
    set_grads(cpu, s);
    set_grads(gpu, s);
    for (auto& o : cpu_opts) o->step();
    for (auto& o : gpu_opts) o->step();
  }
  for (size_t k = 0; k < cpu.size(); ++k) {
    EXPECT_TRUE(gpu[k].is_cuda());
    testing::expect_close(gpu[k].detach().cpu(), cpu[k].detach(), 1e-5, 1e-7);
  }
  EXPECT_TRUE(gpu_opts[1]->state(0, 0).buffers.at("exp_avg").is_cuda());
}

TEST(Optimizer, StateDictRecordsItsOptimizer) {
  auto params = fresh_params();
  AdamW adamw(params, {.lr = 0.01});
  set_grads(params, 0);
  adamw.step();
  const StateDict dict = adamw.state_dict();
  EXPECT_DOUBLE_EQ(dict.scalars.at("type.AdamW"), 1.0);

  // AdamW's state loaded into SGD (or into Adam, whose options it shares) names both.
  auto sgd_params = fresh_params();
  SGD sgd(sgd_params, {.lr = 0.1, .momentum = 0.9});
  EXPECT_EMBER_ERROR(sgd.load_state_dict(dict),
                     "SGD: load_state_dict: the state is from AdamW, not SGD");
  auto adam_params = fresh_params();
  Adam adam(adam_params, {.lr = 0.01});
  EXPECT_EMBER_ERROR(adam.load_state_dict(dict),
                     "Adam: load_state_dict: the state is from AdamW, not Adam");
  EXPECT_DOUBLE_EQ(sgd.param_groups()[0].lr(), 0.1);
  EXPECT_TRUE(sgd.state(0, 0).empty());

  // Into another AdamW it loads, and saving again gives the same keys.
  auto other = fresh_params();
  AdamW target(other, {.lr = 0.5});
  target.load_state_dict(dict);
  EXPECT_DOUBLE_EQ(target.param_groups()[0].lr(), 0.01);
  EXPECT_EQ(target.state_dict().scalars, dict.scalars);
}

// set_state moves one parameter's state between optimizers (what dist::ZeroRedundancyOptimizer
// does between a shard's optimizer and the whole one): the receiver then steps exactly as the
// giver would have.
TEST(Optimizer, SetStateCopiesOneParametersStateAndContinuesExactly) {
  auto a = fresh_params();
  auto b = fresh_params();
  AdamW first(std::vector<Tensor>{a[0], a[1]}, AdamWOptions{.lr = 0.01});
  AdamW second(two_groups(b), AdamWOptions{.lr = 0.01});
  for (int step = 0; step < 3; ++step) {
    set_grads({a[0], a[1]}, step);
    first.step();
  }
  {
    NoGradGuard no_grad;
    Tensor(b[0]).copy_(a[0]);
  }
  second.set_state(0, 0, first.state(0, 0));
  EXPECT_EQ(second.state(0, 0).step_count(), 3);
  // A copy, on the parameter's device: the giver's buffers are not shared.
  EXPECT_NE(second.state(0, 0).buffers.at("exp_avg").data_ptr(),
            first.state(0, 0).buffers.at("exp_avg").data_ptr());
  set_grads({a[0], a[1]}, 3);
  first.step();
  set_grads(b, 3);
  second.step();
  EXPECT_TRUE(equal(b[0].detach(), a[0].detach()));
  ParamState wrong;
  wrong.buffers["exp_avg"] = zeros({3});
  EXPECT_EMBER_ERROR(second.set_state(0, 0, wrong),
                     "AdamW: set_state: buffer \"exp_avg\" has shape [3] but parameter 0 of group "
                     "0 has shape [4]");
  EXPECT_EMBER_ERROR(second.set_state(2, 0, ParamState{}),
                     "AdamW: set_state: no parameter 0 in group 2 (2 groups)");
}

}  // namespace
}  // namespace ember::optim

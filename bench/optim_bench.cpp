// One optimizer step over a ResNet's parameters (ResNet-18-CIFAR by default: 62 tensors,
// 11.2M f32 values), per-parameter path against the multi-tensor one (foreach) in the same
// run: median step time, and the bandwidth the step reaches (bytes of parameters, gradients
// and state read and written). One JSON line per optimizer.
//
//   optim_bench [--model resnet18] [--device cpu|cuda] [--threads 2] [--optimizer all]
#include <CLI/CLI.hpp>

#include <ember/ember.h>

#include "bench_util.h"

namespace {

using ember::Tensor;

struct Variant {
  const char* name;
  int state_tensors;  // state buffers per parameter (each read and written)
  std::function<std::unique_ptr<ember::optim::Optimizer>(std::vector<Tensor>, bool)> make;
};

std::vector<Variant> variants() {
  using namespace ember::optim;
  return {
      {"sgd_nesterov", 1,
       [](std::vector<Tensor> p, bool foreach) {
         return std::unique_ptr<Optimizer>(
             std::make_unique<SGD>(std::move(p), SGDOptions{.lr = 0.1,
                                                            .momentum = 0.9,
                                                            .weight_decay = 5e-4,
                                                            .nesterov = true,
                                                            .foreach = foreach}));
       }},
      {"adam", 2,
       [](std::vector<Tensor> p, bool foreach) {
         return std::unique_ptr<Optimizer>(
             std::make_unique<Adam>(std::move(p), AdamOptions{.lr = 1e-3, .foreach = foreach}));
       }},
      {"adamw", 2,
       [](std::vector<Tensor> p, bool foreach) {
         return std::unique_ptr<Optimizer>(
             std::make_unique<AdamW>(std::move(p), AdamWOptions{.lr = 1e-3, .foreach = foreach}));
       }},
      {"adamw_amsgrad", 3,
       [](std::vector<Tensor> p, bool foreach) {
         return std::unique_ptr<Optimizer>(std::make_unique<AdamW>(
             std::move(p), AdamWOptions{.lr = 1e-3, .amsgrad = true, .foreach = foreach}));
       }},
  };
}

// Copies of the model's parameters, each with a random gradient.
std::vector<Tensor> params_with_grads(ember::nn::Module& model) {
  std::vector<Tensor> params;
  ember::NoGradGuard no_grad;
  for (const Tensor& p : model.parameters()) {
    Tensor c = p.detach().clone();
    c.requires_grad_();
    c.set_grad(ember::randn(c.sizes(), ember::TensorOptions(c.dtype(), c.device())).mul_(1e-2));
    params.push_back(c);
  }
  return params;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember optimizer-step benchmark: per-parameter vs multi-tensor"};
  std::string model_name = "resnet18", device_name = "cpu", only = "all";
  int threads = 2;
  app.add_option("--model", model_name, "resnet20 | resnet56 | resnet18 | resnet34")
      ->check(
          CLI::IsMember({"resnet20", "resnet32", "resnet56", "resnet110", "resnet18", "resnet34"}));
  app.add_option("--device", device_name, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", threads, "CPU threads")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", only, "all | sgd_nesterov | adam | adamw | adamw_amsgrad");
  CLI11_PARSE(app, argc, argv);

  try {
    ember::set_num_threads(threads);
    const ember::Device device(device_name);
    ember::manual_seed(0);
    std::shared_ptr<ember::nn::Module> model = ember::nn::resnet(model_name, 10, 3);
    model->to(device);
    auto sync = [&] {
      if (device.is_cuda()) ember::cuda::synchronize(device.index);
    };
    for (const Variant& v : variants()) {
      if (only != "all" && only != v.name) continue;
      std::vector<Tensor> per_param_params = params_with_grads(*model);
      std::vector<Tensor> multi_params = params_with_grads(*model);
      auto per_param = v.make(per_param_params, false);
      auto multi = v.make(multi_params, true);
      int64_t numel = 0;
      for (const Tensor& p : multi_params) numel += p.numel();
      const std::vector<double> s = ember::bench::median_seconds(
          {[&] { per_param->step(); }, [&] { multi->step(); }}, sync, 3, 10, 1.0, 100);
      // Read: param, grad, state; written: param, state.
      const double bytes =
          static_cast<double>(numel) * sizeof(float) * (3.0 + 2.0 * v.state_tensors);
      ember::bench::JsonLine()
          .add("bench", "optim_step")
          .add("optimizer", v.name)
          .add("model", model_name)
          .add("device", device_name)
          .add("threads", threads)
          .add("tensors", static_cast<long long>(multi_params.size()))
          .add("numel", static_cast<long long>(numel))
          .add("per_param_ms", s[0] * 1e3)
          .add("foreach_ms", s[1] * 1e3)
          .add("speedup", s[0] / s[1])
          .add("per_param_gbps", bytes / s[0] * 1e-9)
          .add("foreach_gbps", bytes / s[1] * 1e-9)
          .print();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

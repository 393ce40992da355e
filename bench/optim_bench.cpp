// One optimizer step over a ResNet's parameters (ResNet-18-CIFAR by default: 62 tensors,
// 11.2M f32 values), per-parameter path against the multi-tensor one (foreach) in the same
// run: median step time, and the bandwidth the step reaches (bytes of parameters, gradients
// and state read and written). One JSON line per optimizer, and one for clip_grad_norm_
// (per-gradient vs foreach).
//
//   optim_bench [--model resnet18] [--device cpu|cuda] [--threads 2] [--optimizer all|NAME,...]
#include <algorithm>
#include <string>
#include <vector>

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

struct Setting {
  std::string model, device;
  int threads;
};

// One JSON line: the per-parameter and foreach medians and the bandwidth each reaches.
void report(const Setting& setting, const char* what, size_t tensors, int64_t numel, double bytes,
            const std::vector<double>& seconds) {
  ember::bench::JsonLine()
      .add("bench", "optim_step")
      .add("optimizer", what)
      .add("model", setting.model)
      .add("device", setting.device)
      .add("threads", setting.threads)
      .add("tensors", static_cast<long long>(tensors))
      .add("numel", static_cast<long long>(numel))
      .add("per_param_ms", seconds[0] * 1e3)
      .add("foreach_ms", seconds[1] * 1e3)
      .add("speedup", seconds[0] / seconds[1])
      .add("per_param_gbps", bytes / seconds[0] * 1e-9)
      .add("foreach_gbps", bytes / seconds[1] * 1e-9)
      .print();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember optimizer-step benchmark: per-parameter vs multi-tensor"};
  std::string model_name = "resnet18", device_name = "cpu";
  std::vector<std::string> only = {"all"};
  int threads = 2;
  app.add_option("--model", model_name, "resnet20 | resnet56 | resnet18 | resnet34")
      ->check(
          CLI::IsMember({"resnet20", "resnet32", "resnet56", "resnet110", "resnet18", "resnet34"}));
  app.add_option("--device", device_name, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", threads, "CPU threads")->check(CLI::PositiveNumber);
  app.add_option("--optimizer", only,
                 "all, or some of sgd_nesterov, adam, adamw, adamw_amsgrad, clip_grad_norm "
                 "separated by commas")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  const auto wanted = [&](const std::string& name) {
    return std::find(only.begin(), only.end(), "all") != only.end() ||
           std::find(only.begin(), only.end(), name) != only.end();
  };

  try {
    ember::set_num_threads(threads);
    const ember::Device device(device_name);
    ember::manual_seed(0);
    std::shared_ptr<ember::nn::Module> model = ember::nn::resnet(model_name, 10, 3);
    model->to(device);
    const Setting setting{model_name, device_name, threads};
    auto sync = [&] {
      if (device.is_cuda()) ember::cuda::synchronize(device.index);
    };
    for (const Variant& v : variants()) {
      if (!wanted(v.name)) continue;
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
      report(setting, v.name, multi_params.size(), numel, bytes, s);
    }
    if (wanted("clip_grad_norm")) {
      // clip_grad_norm_(max_norm = 1): per-gradient norms and multiplies vs two passes.
      std::vector<Tensor> per_grad = params_with_grads(*model);
      std::vector<Tensor> multi = params_with_grads(*model);
      int64_t numel = 0;
      for (const Tensor& p : multi) numel += p.numel();
      const std::vector<double> s = ember::bench::median_seconds(
          {[&] { ember::optim::clip_grad_norm_(per_grad, 1.0, 2.0, false); },
           [&] { ember::optim::clip_grad_norm_(multi, 1.0, 2.0, true); }},
          sync, 3, 10, 1.0, 100);
      const double bytes = static_cast<double>(numel) * sizeof(float) * 3.0;  // read, read+write
      report(setting, "clip_grad_norm", multi.size(), numel, bytes, s);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}

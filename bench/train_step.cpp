// One training step (forward, backward, SGD-Nesterov update) of a ResNet on random
// CIFAR-shaped data: median step time after warm-up, images/s and peak memory, one JSON
// line. bench/train_step_torch.py runs the same step in PyTorch with the same flags and keys.
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <ember/ember.h>

#include "bench_util.h"

int main(int argc, char** argv) {
  CLI::App app{"ember training-step benchmark"};
  std::string model_name = "resnet20", device_name = "cpu";
  int64_t batch = 128;
  int threads = 2, steps = 10;
  app.add_option("--model", model_name, "resnet20 | resnet56 | resnet18")
      ->check(
          CLI::IsMember({"resnet20", "resnet32", "resnet56", "resnet110", "resnet18", "resnet34"}));
  app.add_option("--batch", batch, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--device", device_name, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", threads, "CPU threads")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    ember::set_num_threads(threads);
    const ember::Device device(device_name);
    ember::manual_seed(0);
    auto model = ember::nn::resnet(model_name, 10, 3);
    model->to(device);
    ember::optim::SGDOptions options;
    options.lr = 0.1;
    options.momentum = 0.9;
    options.nesterov = true;
    options.weight_decay = 5e-4;
    ember::optim::SGD optimizer(model->parameters(), options);
    const ember::Tensor images =
        ember::randn({batch, 3, 32, 32}, ember::TensorOptions(ember::kF32, device));
    const ember::Tensor labels =
        ember::randint(0, 10, {batch}, ember::TensorOptions(ember::kI64, device));
    auto step = [&] {
      optimizer.zero_grad();
      const ember::Tensor loss = ember::cross_entropy(model->forward(images), labels);
      loss.backward();
      optimizer.step();
    };
    auto sync = [&] {
      if (device.is_cuda()) ember::cuda::synchronize();
    };
    const double step_s = ember::bench::median_seconds({step}, sync, 2, steps, 0.0, steps)[0];
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    ember::bench::JsonLine()
        .add("framework", "ember")
        .add("model", model_name)
        .add("batch", static_cast<long long>(batch))
        .add("device", device_name)
        .add("threads", threads)
        .add("step_s", step_s)
        .add("images_per_s", static_cast<double>(batch) / step_s)
        .add("peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0)
        .print();
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }
  return 0;
}

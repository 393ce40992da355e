// One GPT training step (forward, backward, AdamW over weight_decay_groups) on random tokens:
// median step time after warm-up, tokens/s, achieved TFLOP/s (nanoGPT's 6N + 12 L d T FLOPs
// per token) and peak memory, one JSON line. bench/gpt_step_torch.py runs the same step in
// PyTorch with the same flags and keys; bench/gpt_compare.sh runs both. --cuda-graphs (ember
// only) replays the whole step captured in one CUDA graph (bench/captured_step.h).
#include <sys/resource.h>

#include <functional>

#include <CLI/CLI.hpp>

#include <ember/ember.h>
#include <ember/optim/param_groups.h>

#include "bench_util.h"
#include "captured_step.h"
#include "precision.h"

int main(int argc, char** argv) {
  CLI::App app{"ember GPT training-step benchmark"};
  std::string device_name = "cpu", precision_name = "fp32";
  ember::nn::GPTConfig config;
  config.vocab_size = 96;
  int64_t batch = 8;
  int threads = 2, steps = 5;
  app.add_option("--n-layer", config.n_layer)->check(CLI::PositiveNumber);
  app.add_option("--n-head", config.n_head)->check(CLI::PositiveNumber);
  app.add_option("--n-embd", config.n_embd)->check(CLI::PositiveNumber);
  app.add_option("--block-size", config.block_size, "tokens per sequence")
      ->check(CLI::PositiveNumber);
  app.add_option("--vocab", config.vocab_size)->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--device", device_name, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--precision", precision_name, "fp32 | tf32 | bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}));
  app.add_option("--threads", threads, "CPU threads")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  bool cuda_graphs = false;
  app.add_flag("--cuda-graphs", cuda_graphs,
               "replay the whole step captured in a CUDA graph (CUDA only)");
  CLI11_PARSE(app, argc, argv);
  config.dropout = 0.0;

  try {
    ember::set_num_threads(threads);
    const ember::Device device(device_name);
    ember::manual_seed(0);
    auto model = std::make_shared<ember::nn::GPT>(config);
    model->to(device);
    ember::optim::AdamWOptions options;
    options.lr = 3e-4;
    options.betas = {0.9, 0.95};
    ember::optim::AdamW optimizer(ember::optim::weight_decay_groups(*model, 0.1), options);
    const auto ids = ember::TensorOptions(ember::kI64, device);
    const ember::Tensor idx = ember::randint(0, config.vocab_size, {batch, config.block_size}, ids);
    const ember::Tensor targets =
        ember::randint(0, config.vocab_size, {batch, config.block_size}, ids);
    ember::apps::PrecisionContext precision(ember::apps::resolve_precision(precision_name, device),
                                            device);
    auto forward_backward_step = [&] {
      ember::Tensor loss;
      {
        const auto autocast = precision.autocast();
        const ember::Tensor logits = model->forward(idx);
        loss = ember::cross_entropy(logits.reshape({-1, config.vocab_size}).to(ember::kF32),
                                    targets.reshape({-1}));
      }
      precision.scale(loss).backward();
      precision.step(optimizer);
    };
    std::function<void()> step = [&] {
      optimizer.zero_grad();
      forward_backward_step();
    };
    ember::cuda::CUDAGraph graph;
    if (cuda_graphs) {
      EMBER_CHECK(device.is_cuda(), "--cuda-graphs", "needs --device cuda");
      ember::bench::capture_training_step(graph, optimizer, forward_backward_step);
      step = [&] { graph.replay(); };
    }
    auto sync = [&] {
      if (device.is_cuda()) ember::cuda::synchronize();
    };
    const double step_s = ember::bench::median_seconds({step}, sync, 2, steps, 0.0, steps)[0];
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const double tokens = static_cast<double>(batch * config.block_size);
    const double flops = ember::nn::gpt_flops_per_token(*model, config.block_size) * tokens;
    ember::bench::JsonLine line;
    line.add("framework", "ember")
        .add("model", "gpt-" + std::to_string(config.n_layer) + "l-" +
                          std::to_string(config.n_head) + "h-" + std::to_string(config.n_embd) +
                          "d")
        .add("block_size", static_cast<long long>(config.block_size))
        .add("batch", static_cast<long long>(batch))
        .add("device", device_name)
        .add("precision", precision.name())
        .add("threads", threads)
        .add("attention", "sdpa")
        .add("cuda_graphs", cuda_graphs)
        .add("parameters", static_cast<long long>(ember::nn::parameter_count(*model)))
        .add("step_s", step_s)
        .add("tokens_per_s", tokens / step_s)
        .add("achieved_tflops", flops / step_s / 1e12)
        .add("peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0);
    if (device.is_cuda()) {
      line.add("peak_gpu_mb",
               static_cast<double>(ember::cuda::memory_stats().peak_allocated_bytes) / (1 << 20));
    }
    line.print();
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "gpt_step: %s\n", e.what());
    return 1;
  }
  return 0;
}

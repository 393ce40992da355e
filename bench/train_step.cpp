// One training step (forward, backward, SGD-Nesterov update) of a ResNet on random
// CIFAR-shaped data: median step time after warm-up, images/s and peak memory, one JSON
// line. bench/train_step_torch.py runs the same step in PyTorch with the same flags and keys.
// --no-fuse turns off the ResNet's fused batch norm + ReLU (+ add), the eager-PyTorch form.
// --precision as ember-train's (apps/precision.h): fp32, tf32, bf16 or fp16 autocast (fp16
// with loss scaling). --cuda-graphs replays the whole step captured in one CUDA graph
// (forward, backward, loss scaling and the optimizer step, as ember-train --cuda-graphs;
// bench/captured_step.h). On CUDA the line also holds the peak memory of
// the caching allocator and, given --peak-tflops (the GPU's dense peak for the precision),
// the model FLOPs utilisation: images/s x 3 x forward FLOPs per image / peak.
#include <sys/resource.h>

#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <ember/ember.h>

#include "bench_util.h"
#include "captured_step.h"
#include "precision.h"

namespace {

// Forward FLOPs per 32x32 image (2 per multiply-add of the convolutions and the classifier),
// the same count as bench/train_step_torch.py's: the stem, each basic block's two 3x3
// convolutions and its 1x1 projection where the shape changes.
double forward_flops(const std::string& model) {
  struct Config {
    std::vector<int64_t> channels, blocks;
  };
  const std::map<std::string, Config> configs = {{"resnet20", {{16, 32, 64}, {3, 3, 3}}},
                                                 {"resnet32", {{16, 32, 64}, {5, 5, 5}}},
                                                 {"resnet56", {{16, 32, 64}, {9, 9, 9}}},
                                                 {"resnet110", {{16, 32, 64}, {18, 18, 18}}},
                                                 {"resnet18", {{64, 128, 256, 512}, {2, 2, 2, 2}}},
                                                 {"resnet34", {{64, 128, 256, 512}, {3, 4, 6, 3}}}};
  const Config& c = configs.at(model);
  int64_t size = 32, cin = c.channels[0];
  double macs = 3.0 * static_cast<double>(cin) * 9 * static_cast<double>(size * size);
  for (size_t stage = 0; stage < c.channels.size(); ++stage) {
    for (int64_t b = 0; b < c.blocks[stage]; ++b) {
      const int64_t stride = stage > 0 && b == 0 ? 2 : 1, cout = c.channels[stage];
      size /= stride;
      const auto pixels = static_cast<double>(size * size);
      macs += static_cast<double>(cin * cout * 9) * pixels +
              static_cast<double>(cout * cout * 9) * pixels;
      if (stride != 1 || cin != cout) macs += static_cast<double>(cin * cout) * pixels;
      cin = cout;
    }
  }
  macs += static_cast<double>(cin * 10);
  return 2.0 * macs;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember training-step benchmark"};
  std::string model_name = "resnet20", device_name = "cpu", precision_name = "fp32";
  int64_t batch = 128;
  int threads = 2, steps = 10;
  bool ddp = false, channels_last = false, cuda_graphs = false, no_fuse = false;
  double peak_tflops = 0;
  app.add_option("--model", model_name, "resnet20 | resnet56 | resnet18")
      ->check(
          CLI::IsMember({"resnet20", "resnet32", "resnet56", "resnet110", "resnet18", "resnet34"}));
  app.add_option("--batch", batch, "images per step")->check(CLI::PositiveNumber);
  app.add_option("--device", device_name, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--threads", threads, "CPU threads")->check(CLI::PositiveNumber);
  app.add_option("--precision", precision_name, "fp32 | tf32 | bf16 | fp16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--steps", steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_flag("--ddp", ddp, "under mpirun: DDP step time beside the no_sync step time");
  app.add_flag("--channels-last", channels_last, "model and images in channels_last (NHWC)");
  app.add_flag("--cuda-graphs", cuda_graphs,
               "replay the whole step captured in a CUDA graph (CUDA, one process)");
  app.add_option("--peak-tflops", peak_tflops,
                 "the device's dense peak for this precision, for the MFU field (0: none)");
  app.add_flag("--no-fuse", no_fuse,
               "batch norm, add and relu one by one (ResNet::set_fused(false)), as eager PyTorch");
  CLI11_PARSE(app, argc, argv);

  try {
    ember::set_num_threads(threads);
    const ember::Device device(device_name);
    ember::manual_seed(0);
    const auto resnet = ember::nn::resnet(model_name, 10, 3);
    resnet->set_fused(!no_fuse);
    std::shared_ptr<ember::nn::Module> model = resnet;
    model->to(device);
    const auto format =
        channels_last ? ember::MemoryFormat::ChannelsLast : ember::MemoryFormat::Contiguous;
    model->to(format);
    std::shared_ptr<ember::dist::ProcessGroup> group;
    std::shared_ptr<ember::dist::DistributedDataParallel> wrapped;
    if (ddp) {
      ember::dist::InitOptions init;
      init.device = device;  // else a visible GPU would pick NCCL for a CPU run
      group = ember::dist::init_process_group(init);
      wrapped = std::make_shared<ember::dist::DistributedDataParallel>(model, group);
    }
    ember::nn::Module& trained = wrapped ? static_cast<ember::nn::Module&>(*wrapped) : *model;
    ember::optim::SGDOptions options;
    options.lr = 0.1;
    options.momentum = 0.9;
    options.nesterov = true;
    options.weight_decay = 5e-4;
    ember::optim::SGD optimizer(model->parameters(), options);
    const ember::Tensor images =
        ember::randn({batch, 3, 32, 32}, ember::TensorOptions(ember::kF32, device)).to(format);
    const ember::Tensor labels =
        ember::randint(0, 10, {batch}, ember::TensorOptions(ember::kI64, device));
    ember::apps::PrecisionContext precision(ember::apps::resolve_precision(precision_name, device),
                                            device);
    auto forward_backward = [&] {
      ember::Tensor loss;
      {
        const auto autocast = precision.autocast();
        loss = ember::cross_entropy(trained.forward(images), labels);
      }
      precision.scale(loss).backward();
    };
    auto step = [&] {
      optimizer.zero_grad();
      forward_backward();
      precision.step(optimizer);
    };
    ember::cuda::CUDAGraph graph;
    if (cuda_graphs) {
      EMBER_CHECK(device.is_cuda() && !ddp, "--cuda-graphs", "needs --device cuda and one process");
      ember::bench::capture_training_step(graph, optimizer, [&] {
        forward_backward();
        precision.step(optimizer);
      });
    }
    auto graph_step = [&] { graph.replay(); };
    if (device.is_cuda()) ember::cuda::reset_peak_stats();
    // The same step with gradient synchronisation off: the compute-only baseline for DDP.
    auto local_step = [&] {
      auto no_sync = wrapped->no_sync();
      step();
    };
    // Under DDP every timed step starts and ends with a barrier, so each is timed from a
    // common start to the slowest rank's finish, the DDP and the no_sync step alike: the
    // ratio then shows what gradient traffic adds, not how far the ranks drifted apart.
    auto sync = [&] {
      if (device.is_cuda()) ember::cuda::synchronize();
      if (group) group->barrier()->wait();
    };
    std::vector<std::function<void()>> runs{cuda_graphs ? std::function<void()>(graph_step)
                                                        : std::function<void()>(step)};
    if (wrapped) runs.push_back(local_step);
    const std::vector<double> times =
        ember::bench::median_seconds(runs, sync, 2, steps, 0.0, steps);
    const double step_s = times[0];
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    if (group && group->rank() != 0) return 0;
    ember::bench::JsonLine line;
    line.add("framework", "ember")
        .add("model", model_name)
        .add("batch", static_cast<long long>(batch))
        .add("device", device_name)
        // The f32 policy on CUDA (tensor/precision.h; the CPU computes in f32 regardless).
        .add("precision", precision.name())
        .add("matmul_precision", ember::get_float32_matmul_precision())
        .add("cudnn_allow_tf32", ember::cudnn_allow_tf32())
        .add("channels_last", channels_last)
        .add("cuda_graphs", cuda_graphs)
        .add("fused", !no_fuse)
        .add("threads", threads)
        .add("step_s", step_s)
        .add("images_per_s", static_cast<double>(batch) / step_s)
        .add("peak_rss_mb", static_cast<double>(usage.ru_maxrss) / 1024.0)
        .add("ms_per_step", 1e3 * step_s)
        .add("train_gflop_per_image", 3.0 * forward_flops(model_name) / 1e9);
    if (device.is_cuda()) {
      line.add("peak_gpu_mem_mb",
               static_cast<double>(ember::cuda::memory_stats().peak_allocated_bytes) / (1 << 20));
    }
    if (peak_tflops > 0) {
      line.add("peak_tflops", peak_tflops)
          .add("mfu", static_cast<double>(batch) / step_s * 3.0 * forward_flops(model_name) /
                          (peak_tflops * 1e12));
    }
    if (wrapped) {
      line.add("ranks", group->size())
          .add("no_sync_step_s", times[1])
          .add("ddp_over_no_sync", step_s / times[1]);
    }
    line.print();
  } catch (const ember::Error& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    return 1;
  }
  return 0;
}

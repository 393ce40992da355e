// ZeRO's memory and step time: DDP + AdamW against ZeroRedundancyOptimizer (ZeRO-1) and with
// DDP's gradient sharding (ZeRO-2), for ResNet-18 (CIFAR-sized input) and the 6-layer GPT,
// on the CPU. Run under a launcher, e.g.
//   mpirun -np 2 build/bench/zero
//   mpirun -np 4 build/bench/zero --models gpt --steps 3
// Each rank measures, per model and mode in turn (one model alive at a time): the optimizer
// state it holds (bytes of its buffers after a step), the gradient bytes it holds between
// steps, and the allocator's peak over one step (cpu_memory_stats). Then the three modes take
// turns step by step (bench_util.h's median_seconds) for the step times. Rank 0 prints one JSON
// line per model and mode with the largest of the ranks' figures ("bench": "zero").
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <ember/ember.h>
#include <ember/optim/param_groups.h>
#include <ember/tensor/allocator.h>

#include "bench_util.h"

namespace {

using namespace ember;

struct Setup {
  std::shared_ptr<nn::Module> model;
  std::shared_ptr<dist::DistributedDataParallel> ddp;
  std::unique_ptr<optim::Optimizer> opt;
  std::function<Tensor()> loss;
};

Setup make(const std::string& model, int stage, const std::shared_ptr<dist::ProcessGroup>& pg,
           int64_t batch) {
  Setup s;
  manual_seed(0);
  std::vector<optim::ParamGroup> groups;
  Tensor x, y;
  if (model == "gpt") {
    nn::GPTConfig config;
    config.vocab_size = 96;
    auto gpt = std::make_shared<nn::GPT>(config);
    s.model = gpt;
    groups = optim::weight_decay_groups(*gpt, 0.1);
    x = randint(0, config.vocab_size, {batch, config.block_size}, kI64);
    y = randint(0, config.vocab_size, {batch, config.block_size}, kI64);
  } else {
    s.model = nn::resnet("resnet18", 10, 3);
    groups = {optim::ParamGroup(s.model->parameters())};
    x = randn({batch, 3, 32, 32});
    y = randint(0, 10, {batch}, kI64);
  }
  s.ddp = std::make_shared<dist::DistributedDataParallel>(s.model, pg);
  optim::AdamWOptions adamw;
  adamw.lr = 1e-4;
  const dist::OptimizerFactory factory = dist::optimizer_factory<optim::AdamW>(adamw);
  if (stage == 0) {
    s.opt = factory(groups);
  } else {
    auto zero = std::make_unique<dist::ZeroRedundancyOptimizer>(groups, factory, pg);
    if (stage == 2) zero->shard_gradients(*s.ddp);
    s.opt = std::move(zero);
  }
  auto* ddp = s.ddp.get();
  s.loss = [ddp, x, y] {
    const Tensor out = (*ddp)(x);
    return cross_entropy(out.reshape({-1, out.size(-1)}), y.reshape({-1}));
  };
  return s;
}

void step(Setup& s) {
  s.opt->zero_grad();
  s.loss().backward();
  s.opt->step();
}

int64_t state_bytes(Setup& s, int stage) {
  optim::Optimizer* opt = s.opt.get();
  if (stage > 0) opt = static_cast<dist::ZeroRedundancyOptimizer*>(opt)->local_optimizer();
  int64_t bytes = 0;
  for (size_t g = 0; opt != nullptr && g < opt->param_groups().size(); ++g) {
    for (size_t i = 0; i < opt->param_groups()[g].params.size(); ++i) {
      for (const auto& [name, buffer] : opt->state(g, i).buffers)
        bytes += static_cast<int64_t>(buffer.nbytes());
    }
  }
  return bytes;
}

int64_t grad_bytes(Setup& s) {
  int64_t bytes = 0;
  for (const Tensor& p : s.model->parameters()) {
    if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
  }
  return bytes;
}

// The largest of the ranks' values.
std::vector<double> largest(dist::ProcessGroup& pg, const std::vector<double>& mine) {
  Tensor t = from_vector<double>(mine, {static_cast<int64_t>(mine.size())});
  pg.allreduce(t, dist::ReduceOp::kMax)->wait();
  return t.to_vector<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ember ZeRO memory and step-time benchmark"};
  std::vector<std::string> models = {"resnet18", "gpt"};
  int64_t resnet_batch = 16, gpt_batch = 4;
  int threads = 1, steps = 5;
  app.add_option("--models", models, "resnet18 and/or gpt");
  app.add_option("--resnet-batch", resnet_batch, "images per rank")->check(CLI::PositiveNumber);
  app.add_option("--gpt-batch", gpt_batch, "sequences of 256 per rank")->check(CLI::PositiveNumber);
  app.add_option("--threads", threads, "CPU threads per rank")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "timed steps per mode (at least)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    dist::InitOptions init;
    init.device = kCPU;
    const std::shared_ptr<dist::ProcessGroup> pg = dist::init_process_group(init);
    const char* names[] = {"ddp", "zero1", "zero2"};
    for (const std::string& model : models) {
      const int64_t batch = model == "gpt" ? gpt_batch : resnet_batch;
      // Memory: one mode alive at a time.
      std::vector<std::vector<double>> memory;
      for (int stage = 0; stage < 3; ++stage) {
        Setup s = make(model, stage, pg, batch);
        step(s);  // the state exists from here on
        reset_cpu_peak_memory_stats();
        const double before = static_cast<double>(cpu_memory_stats().allocated_bytes);
        step(s);
        const double peak = static_cast<double>(cpu_memory_stats().peak_allocated_bytes);
        memory.push_back(largest(*pg, {static_cast<double>(state_bytes(s, stage)),
                                       static_cast<double>(grad_bytes(s)), before, peak}));
      }
      // Step time: the three take turns.
      std::vector<Setup> setups;
      for (int stage = 0; stage < 3; ++stage) setups.push_back(make(model, stage, pg, batch));
      std::vector<std::function<void()>> fns;
      for (Setup& s : setups) fns.push_back([&s] { step(s); });
      const auto seconds = bench::median_seconds(
          fns, [] {}, 1, steps, 0.0, steps);
      const auto slowest = largest(*pg, seconds);
      if (pg->rank() == 0) {
        for (int stage = 0; stage < 3; ++stage) {
          const auto& m = memory[static_cast<size_t>(stage)];
          bench::JsonLine()
              .add("bench", "zero")
              .add("model", model)
              .add("mode", names[stage])
              .add("ranks", pg->size())
              .add("batch_per_rank", static_cast<long long>(batch))
              .add("optimizer_state_bytes", static_cast<long long>(m[0]))
              .add("grad_bytes_between_steps", static_cast<long long>(m[1]))
              .add("allocated_bytes_between_steps", static_cast<long long>(m[2]))
              .add("peak_bytes_in_step", static_cast<long long>(m[3]))
              .add("step_ms", 1e3 * slowest[static_cast<size_t>(stage)])
              .add("vs_ddp", slowest[static_cast<size_t>(stage)] / slowest[0])
              .print();
        }
      }
    }
    dist::destroy_process_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Compiled, never run: dist's headers used the way a PyTorch user writes C++, under
// -Wall -Wextra -Wshadow -Werror (see mpi_tests.cmake). Designated initializers that leave
// fields out must not warn (-Wmissing-field-initializers), nor may the headers shadow.
// The other modules' headers come first, with -Wshadow off: this checks dist's own.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wshadow"
#include <ember/data/dataloader.h>
#include <ember/nn/nn.h>
#include <ember/optim/lr_scheduler.h>
#include <ember/optim/optimizer.h>
#include <ember/optim/sgd.h>
#include <ember/tensor/ops.h>
#include <ember/tensor/random.h>
#pragma GCC diagnostic pop

#include <chrono>
#include <memory>

#include <ember/dist/dist.h>

namespace dist = ember::dist;

int user_style_headers(ember::nn::Module& model, ember::optim::Optimizer& optimizer,
                       std::shared_ptr<ember::nn::Module> net) {
  using namespace std::chrono_literals;
  dist::init_process_group({.backend = "gloo"});
  auto ddp = std::make_shared<dist::DistributedDataParallel>(dist::convert_sync_batchnorm(net));
  dist::DistributedDataParallel unused(net, dist::DDPOptions{.find_unused_parameters = true});
  dist::destroy_process_group();
  dist::InitOptions init{.backend = "tcp"};
  init.group = dist::ProcessGroupOptions{.timeout = 30s};
  dist::init_process_group(init);
  const dist::DistributedSamplerOptions sampler_options{.shuffle = false};
  dist::DistributedSampler sampler(100, dist::get_world_size(), dist::get_rank(), sampler_options);
  dist::Checkpoint checkpoint{.model = &model, .optimizer = &optimizer, .epoch = 3};
  dist::save_checkpoint("ckpt.safetensors", checkpoint, dist::get_default_group().get());
  if (dist::get_rank() == 0) dist::save_checkpoint("snapshot.safetensors", checkpoint);
  dist::Checkpoint restore{.model = &model};
  dist::load_checkpoint("ckpt.safetensors", restore);
  const dist::LaunchEnv launch{.launcher = "torchrun", .rank = 1, .world_size = 2};
  ember::Tensor t = ember::ones({4});
  dist::all_reduce(t, dist::ReduceOp::kAvg);
  dist::WorkHandle work = dist::broadcast(t, 0, /*async_op=*/true);
  work->wait();
  dist::barrier();
  dist::destroy_process_group();
  return static_cast<int>(restore.epoch) + launch.rank;
}

// A complete data-parallel training loop in one file, in the spirit of PyTorch's DDP
// tutorial: each rank trains a small model on its shard of a regression task, DDP averages
// the gradients, and rank 0 reports. Runs alone or under `mpirun -np N`, on the CPU or, with
// `ddp_example cuda`, on one GPU per process.
#include <cstdio>
#include <cstring>

#include <ember/ember.h>

using namespace ember;

// y = relu(x W1^T + b1) W2^T + b2
class ToyModel : public nn::Module {
 public:
  ToyModel() {
    hidden_ = register_module("hidden", std::make_shared<nn::Linear>(10, 32));
    out_ = register_module("out", std::make_shared<nn::Linear>(32, 5));
  }
  Tensor forward(const Tensor& x) override { return out_->forward(relu(hidden_->forward(x))); }
  std::string name() const override { return "ToyModel"; }

 private:
  std::shared_ptr<nn::Linear> hidden_, out_;
};

int main(int argc, char** argv) {
  try {
    const bool on_gpu = argc > 1 && std::strcmp(argv[1], "cuda") == 0;
    dist::InitOptions init;
    init.device = on_gpu ? cuda_device(dist::read_launch_env().local_rank) : kCPU;
    if (on_gpu) init.backend = "nccl";  // also for one process, which would get "single"
    std::shared_ptr<dist::ProcessGroup> group = dist::init_process_group(init);
    const Device device = *init.device;
    manual_seed(1234);  // DDP broadcasts rank 0's parameters anyway
    auto model = std::make_shared<ToyModel>();
    model->to(device);
    dist::DistributedDataParallel ddp(model, group);
    optim::SGDOptions options;
    options.lr = 0.05;
    options.momentum = 0.9;
    optim::SGD optimizer(model->parameters(), options);

    // The task: a fixed random linear map; each rank draws its own samples.
    Generator task(7);
    const Tensor truth = randn({10, 5}, kF32, &task).to(device);
    Generator samples(100 + static_cast<uint64_t>(group->rank()));
    float first = 0, last = 0;
    for (int step = 0; step < 100; ++step) {
      const Tensor x = randn({32, 10}, kF32, &samples).to(device);
      const Tensor y = matmul(x, truth);
      optimizer.zero_grad();
      const Tensor loss = mse_loss(ddp.forward(x), y);
      loss.backward();  // gradients are averaged across ranks as they become ready
      optimizer.step();
      const auto averaged = dist::average_across_ranks({{"loss", loss.item<double>()}}, *group);
      if (step == 0) first = static_cast<float>(averaged.at("loss"));
      last = static_cast<float>(averaged.at("loss"));
    }
    if (group->rank() == 0) {
      std::printf("ddp_example: %d rank(s) on %s, loss %.4f -> %.4f\n", group->size(),
                  device.str().c_str(), first, last);
    }
    return last < 0.5f * first ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "ddp_example: %s\n", e.what());
    return 1;
  }
}

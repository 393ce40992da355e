// PyTorch's DDP tutorial, multigpu.py, ported line by line (CPU ranks, the "gloo" backend):
//
//   multigpu WORLD_SIZE SAVE_EVERY TOTAL_EPOCHS BATCH_SIZE CHECKPOINT OUT
//
// mp.spawn starts WORLD_SIZE workers; each trains and returns its final parameters. Then the
// parent checks what a PyTorch user expects: every rank ends with the same parameters (bit for
// bit), each epoch's loop visits the order its set_epoch selected (the tutorial peeks one
// batch first), and the checkpoint rank 0 wrote holds its final parameters. The parameters go
// to OUT, one per line, for comparing world sizes.
#include <cstdio>
#include <fstream>
#include <iomanip>

#include "tutorial.h"

using namespace ember;

namespace {

class Trainer {
 public:
  Trainer(std::shared_ptr<nn::Module> model, std::unique_ptr<data::DataLoader> train_data,
          optim::Optimizer& optimizer, int gpu_id, int save_every, std::string checkpoint)
      : module_(model),
        model_(model),  // DDP(model, device_ids=[gpu_id]): the default group
        train_data_(std::move(train_data)),
        optimizer_(optimizer),
        gpu_id_(gpu_id),
        save_every_(save_every),
        checkpoint_(std::move(checkpoint)) {}

  void train(int max_epochs) {
    for (int epoch = 0; epoch < max_epochs; ++epoch) {
      run_epoch(epoch);
      if (gpu_id_ == 0 && epoch % save_every_ == 0) save_checkpoint(epoch);
    }
  }

 private:
  void run_batch(const Tensor& source, const Tensor& targets) {
    optimizer_.zero_grad();
    const Tensor output = model_.forward(source);
    // The tutorial's F.cross_entropy over a single output is constant (its gradient is zero);
    // the regression loss gives the ranks something to agree on.
    const Tensor loss = mse_loss(output, targets);
    loss.backward();
    optimizer_.step();
  }

  void run_epoch(int epoch) {
    const int64_t b_sz = (*train_data_->begin()).data.size(0);  // next(iter(train_data))
    std::printf("[GPU%d] Epoch %d | Batchsize: %lld | Steps: %lld\n", gpu_id_, epoch,
                static_cast<long long>(b_sz), static_cast<long long>(train_data_->size()));
    auto& sampler = dynamic_cast<dist::DistributedSampler&>(*train_data_->options().sampler);
    sampler.set_epoch(static_cast<uint64_t>(epoch));
    std::vector<int64_t> visited;
    for (const data::Batch& batch : *train_data_) {
      visited.insert(visited.end(), batch.indices.begin(), batch.indices.end());
      run_batch(batch.data, batch.target);
    }
    // What torch's loop visits: the sampler's order for this epoch, not the next one's.
    dist::DistributedSampler fresh(train_data_->dataset().size(), sampler.num_replicas(),
                                   sampler.rank());
    fresh.set_epoch(static_cast<uint64_t>(epoch));
    if (visited != fresh.indices()) {
      throw Error("multigpu: epoch " + std::to_string(epoch) +
                  "'s loop did not visit the order set_epoch selected");
    }
  }

  void save_checkpoint(int epoch) {
    dist::Checkpoint ckp;  // model.module.state_dict()
    ckp.model = module_.get();
    dist::save_checkpoint(checkpoint_, ckp);  // torch.save(ckp, PATH): rank 0 only, no barrier
    std::printf("Epoch %d | Training checkpoint saved at %s\n", epoch, checkpoint_.c_str());
  }

  std::shared_ptr<nn::Module> module_;
  dist::DistributedDataParallel model_;
  std::unique_ptr<data::DataLoader> train_data_;
  optim::Optimizer& optimizer_;
  int gpu_id_, save_every_;
  std::string checkpoint_;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr,
                 "usage: multigpu WORLD_SIZE SAVE_EVERY TOTAL_EPOCHS BATCH_SIZE CHECKPOINT OUT\n");
    return 2;
  }
  const int world_size = std::atoi(argv[1]);
  const int save_every = std::atoi(argv[2]);
  const int total_epochs = std::atoi(argv[3]);
  const int batch_size = std::atoi(argv[4]);
  const std::string checkpoint = argv[5];
  try {
    // mp.spawn(main, args=(world_size, save_every, total_epochs, batch_size), nprocs=world_size)
    const auto results = dist::spawn(world_size, [&](int rank) {
      dist::init_process_group({.backend = "gloo", .rank = rank, .world_size = world_size});
      auto dataset = tutorial::my_train_dataset(2048);
      auto model = tutorial::make_model();
      optim::SGD optimizer(model->parameters(), {.lr = 1e-3});
      Trainer trainer(model, tutorial::prepare_dataloader(dataset, batch_size), optimizer, rank,
                      save_every, checkpoint);
      trainer.train(total_epochs);
      dist::destroy_process_group();
      return tutorial::flat_parameters(*model);
    });
    for (size_t r = 1; r < results.size(); ++r) {
      if (results[r] != results[0]) {
        std::fprintf(stderr, "multigpu: rank %zu's parameters differ from rank 0's\n", r);
        return 1;
      }
    }
    // The checkpoint holds rank 0's final parameters (saved after the last epoch).
    auto loaded = tutorial::make_model();
    dist::Checkpoint ckp;
    ckp.model = loaded.get();
    dist::load_checkpoint(checkpoint, ckp);
    if (tutorial::flat_parameters(*loaded) != results[0]) {
      std::fprintf(stderr, "multigpu: %s does not hold rank 0's final parameters\n",
                   checkpoint.c_str());
      return 1;
    }
    std::ofstream out(argv[6]);
    out << std::setprecision(17);
    for (double v : results[0]) out << v << '\n';
    std::printf("multigpu: %d rank(s) agree bit for bit; the checkpoint holds rank 0's\n",
                world_size);
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "multigpu: %s\n", e.what());
    return 1;
  }
}

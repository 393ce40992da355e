// PyTorch's DDP tutorial, multigpu_torchrun.py, ported line by line (CPU ranks, "gloo"):
//
//   multigpu_torchrun TOTAL_EPOCHS SAVE_EVERY SNAPSHOT OUT [KILL_AT_EPOCH]
//
// Started by a launcher (ember-run, torchrun-style variables, or mpirun). Rank 0 of each node
// saves a snapshot (model and epochs run) every SAVE_EVERY epochs, guarded by `if local_rank
// == 0` as in the tutorial; a restarted job loads it and resumes. KILL_AT_EPOCH (a test's
// fault): in the first attempt (EMBER_RESTART_COUNT 0) rank 1 SIGKILLs itself after its first
// step of that epoch. Rank 0 writes the final parameters to OUT, one per line, and every rank
// checks that all ranks agree bit for bit.
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>

#include "tutorial.h"

using namespace ember;

namespace {

class Trainer {
 public:
  Trainer(std::shared_ptr<nn::Module> model, std::unique_ptr<data::DataLoader> train_data,
          optim::Optimizer& optimizer, int save_every, std::string snapshot_path, int kill_at)
      : gpu_id_(dist::get_local_rank()),  // int(os.environ["LOCAL_RANK"])
        module_(std::move(model)),
        train_data_(std::move(train_data)),
        optimizer_(optimizer),
        save_every_(save_every),
        snapshot_path_(std::move(snapshot_path)),
        kill_at_(kill_at) {
    if (std::filesystem::exists(snapshot_path_)) {
      std::printf("Loading snapshot\n");
      load_snapshot();
    }
    model_ = std::make_unique<dist::DistributedDataParallel>(module_);
  }

  void train(int max_epochs) {
    for (int epoch = epochs_run_; epoch < max_epochs; ++epoch) {
      run_epoch(epoch);
      if (gpu_id_ == 0 && epoch % save_every_ == 0) save_snapshot(epoch);
    }
  }

  nn::Module& module() { return *module_; }

 private:
  void load_snapshot() {
    dist::Checkpoint snapshot;
    snapshot.model = module_.get();  // snapshot["MODEL_STATE"]
    dist::load_checkpoint(snapshot_path_, snapshot);
    epochs_run_ = static_cast<int>(snapshot.epoch);  // snapshot["EPOCHS_RUN"]
    std::printf("Resuming training from snapshot at Epoch %d\n", epochs_run_);
  }

  void save_snapshot(int epoch) {
    dist::Checkpoint snapshot;
    snapshot.model = module_.get();
    // The tutorial stores `epoch` as EPOCHS_RUN and so runs that epoch again after a restart;
    // the epochs run are epoch + 1, which makes a resumed run end where an unbroken one does.
    snapshot.epoch = epoch + 1;
    dist::save_checkpoint(snapshot_path_, snapshot);
    std::printf("Epoch %d | Training snapshot saved at %s\n", epoch, snapshot_path_.c_str());
  }

  void run_batch(const Tensor& source, const Tensor& targets) {
    optimizer_.zero_grad();
    const Tensor loss = mse_loss(model_->forward(source), targets);
    loss.backward();
    optimizer_.step();
  }

  void run_epoch(int epoch) {
    const int64_t b_sz = (*train_data_->begin()).data.size(0);  // next(iter(train_data))
    std::printf("[GPU%d] Epoch %d | Batchsize: %lld | Steps: %lld\n", gpu_id_, epoch,
                static_cast<long long>(b_sz), static_cast<long long>(train_data_->size()));
    train_data_->options().sampler->set_epoch(static_cast<uint64_t>(epoch));
    bool first = true;
    for (const data::Batch& batch : *train_data_) {
      run_batch(batch.data, batch.target);
      if (first && epoch == kill_at_ && dist::get_rank() == 1 &&
          tutorial::env_int("EMBER_RESTART_COUNT", 0) == 0) {
        std::fflush(stdout);
        std::raise(SIGKILL);
      }
      first = false;
    }
  }

  int gpu_id_;
  std::shared_ptr<nn::Module> module_;
  std::unique_ptr<dist::DistributedDataParallel> model_;
  std::unique_ptr<data::DataLoader> train_data_;
  optim::Optimizer& optimizer_;
  int save_every_;
  std::string snapshot_path_;
  int kill_at_;
  int epochs_run_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr,
                 "usage: multigpu_torchrun TOTAL_EPOCHS SAVE_EVERY SNAPSHOT OUT [KILL_AT_EPOCH]\n");
    return 2;
  }
  const int total_epochs = std::atoi(argv[1]);
  const int save_every = std::atoi(argv[2]);
  const int kill_at = argc == 6 ? std::atoi(argv[5]) : -1;
  try {
    dist::init_process_group({.backend = "gloo"});  // ddp_setup()
    auto dataset = tutorial::my_train_dataset(2048);
    auto model = tutorial::make_model();
    optim::SGD optimizer(model->parameters(), {.lr = 1e-3});
    Trainer trainer(model, tutorial::prepare_dataloader(dataset, 32), optimizer, save_every,
                    argv[3], kill_at);
    trainer.train(total_epochs);

    // Every rank's parameters equal rank 0's, bit for bit.
    const std::vector<double> mine = tutorial::flat_parameters(trainer.module());
    Tensor gathered = zeros({dist::get_world_size(), static_cast<int64_t>(mine.size())}, kF64);
    std::vector<Tensor> rows;
    for (int64_t r = 0; r < gathered.size(0); ++r) rows.push_back(gathered.select(0, r));
    dist::all_gather(rows, from_vector(mine, {static_cast<int64_t>(mine.size())}));
    for (const Tensor& row : rows) {
      if (row.to_vector<double>() != mine) throw Error("multigpu_torchrun: ranks disagree");
    }
    if (dist::get_rank() == 0) {
      std::ofstream out(argv[4]);
      out << std::setprecision(17);
      for (double v : mine) out << v << '\n';
      std::printf("multigpu_torchrun: %d ranks agree bit for bit\n", dist::get_world_size());
    }
    dist::destroy_process_group();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "multigpu_torchrun: %s\n", e.what());
    return 1;
  }
}

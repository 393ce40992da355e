// PyTorch's fault-tolerance tutorial, multigpu_torchrun.py, ported to ember's installed
// apps::Trainer: a Trainer that saves a snapshot every `save_every` steps, loads the newest one
// when it starts, and trains `total_epochs` epochs under DDP, alone or under ember-run.
//
//   multigpu_torchrun DIR TOTAL_EPOCHS SAVE_EVERY [CRASH_AT]
//
// Snapshots go to DIR/snapshots; rank 0 writes the final parameters to DIR/final.txt (hex
// floats, so runs compare exactly). CRASH_AT > 0: on the first attempt (EMBER_RESTART_COUNT
// unset or 0), the last rank dies of SIGKILL at that training step, as a worker killed by the
// machine would.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <ember/ember.h>

using namespace ember;

namespace {

// The tutorial's MyTrainDataset: `size` random samples of 20 features, here with a class
// each (4 classes, from a fixed linear map) so the cross-entropy loss has something to learn.
std::shared_ptr<data::TensorDataset> my_train_dataset(int64_t size, uint64_t seed) {
  Generator task(7), samples(seed);
  const Tensor truth = randn({20, 4}, kF32, &task);
  const Tensor x = randn({size, 20}, kF32, &samples);
  return std::make_shared<data::TensorDataset>(x, argmax(matmul(x, truth), 1));
}

// The model, which dies like a killed worker at training step `crash_at` (0: never).
class Model : public nn::Module {
 public:
  explicit Model(int64_t crash_at) : crash_at_(crash_at) {
    hidden_ = register_module("hidden", std::make_shared<nn::Linear>(20, 32));
    out_ = register_module("out", std::make_shared<nn::Linear>(32, 4));
  }
  Tensor forward(const Tensor& x) override {
    if (is_training() && ++steps_ == crash_at_) std::raise(SIGKILL);
    return out_->forward(relu(hidden_->forward(x)));
  }
  std::string name() const override { return "Model"; }

 private:
  int64_t crash_at_, steps_ = 0;
  std::shared_ptr<nn::Linear> hidden_, out_;
};

// prepare_dataloader: DataLoader(dataset, batch_size, shuffle=False,
// sampler=DistributedSampler(dataset)).
std::unique_ptr<data::DataLoader> prepare_dataloader(
    std::shared_ptr<const data::Dataset> dataset, int64_t batch_size,
    std::shared_ptr<dist::DistributedSampler> sampler) {
  data::DataLoaderOptions options;
  options.batch_size = batch_size;
  options.sampler = std::move(sampler);
  return std::make_unique<data::DataLoader>(std::move(dataset), options);
}

int run(const std::string& dir, int64_t total_epochs, int64_t save_every, int64_t crash_at) {
  std::shared_ptr<dist::ProcessGroup> group = dist::init_process_group();  // ddp_setup()
  const char* restarts = std::getenv("EMBER_RESTART_COUNT");
  const bool first_attempt = restarts == nullptr || std::string(restarts) == "0";
  const bool crashes = crash_at > 0 && first_attempt && group->rank() == group->size() - 1;

  // load_train_objs()
  manual_seed(1234);  // DDP broadcasts rank 0's parameters anyway
  auto model = std::make_shared<Model>(crashes ? crash_at : 0);
  optim::SGD optimizer(model->parameters(), {.lr = 0.05, .momentum = 0.9});
  auto train_set = my_train_dataset(256, 1);
  auto test_set = my_train_dataset(64, 2);
  auto sampler = std::make_shared<dist::DistributedSampler>(train_set->size(), *group);
  auto train_data = prepare_dataloader(train_set, 16, sampler);
  auto test_data = prepare_dataloader(
      test_set, 16,
      std::make_shared<dist::DistributedSampler>(
          test_set->size(), *group, dist::DistributedSamplerOptions{.shuffle = false}));

  // Trainer(model, train_data, optimizer, save_every, snapshot_path)
  apps::TrainOptions options;
  options.epochs = total_epochs;
  options.checkpoint_dir = dir + "/snapshots";
  options.save_every_steps = save_every;
  options.resume = "auto";  // the newest snapshot when there is one, else a fresh start
  dist::DistributedDataParallel ddp(model, group);
  dist::Checkpoint snapshot;
  snapshot.model = model.get();
  snapshot.optimizer = &optimizer;
  snapshot.sampler = sampler.get();
  snapshot.generators = {{"default", &default_generator()}};
  const bool leader = group->rank() == 0;
  apps::MetricsLog metrics(dir + "/metrics", leader, /*append=*/true);
  apps::Progress progress(leader, /*log_interval=*/8);
  apps::Trainer trainer(options, *model, ddp, optimizer, /*schedule=*/nullptr, *group, kCPU);
  trainer.attach(*train_data, *test_data, &snapshot, metrics, progress);
  const int64_t epochs_run = trainer.resume();
  metrics.drop_after(trainer.step());
  const apps::EvalResult result = trainer.train(epochs_run);  // trainer.train(total_epochs)

  if (leader) {
    std::ofstream out(dir + "/final.txt");
    for (const auto& [name, p] : model->named_parameters()) {
      out << name;
      for (const float v : p.to_vector<float>()) {
        char hex[32];
        std::snprintf(hex, sizeof hex, " %a", static_cast<double>(v));
        out << hex;
      }
      out << "\n";
    }
    std::printf(
        "multigpu_torchrun: %d rank(s), resumed at epoch %ld, %ld steps, test loss %.4f "
        "accuracy %.1f%%\n",
        group->size(), static_cast<long>(epochs_run), static_cast<long>(trainer.step()),
        result.loss, 100 * result.accuracy);
  }
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: multigpu_torchrun DIR TOTAL_EPOCHS SAVE_EVERY [CRASH_AT]\n");
    return 2;
  }
  try {
    return run(argv[1], std::atoll(argv[2]), std::atoll(argv[3]),
               argc > 4 ? std::atoll(argv[4]) : 0);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

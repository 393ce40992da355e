// ember-train: trains a ResNet with ember's own stack and evaluates it every epoch.
//
// Runs alone, under `mpirun -np N`, `srun`, or with torchrun-style variables: rank 0 alone
// prints and writes. See README.md for the recipes.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include <ember/dist/checkpoint.h>
#include <ember/dist/ddp.h>
#include <ember/dist/distributed_sampler.h>
#include <ember/dist/init.h>
#include <ember/dist/metrics.h>
#include <ember/dist/sync_batch_norm.h>
#include <ember/ember.h>

#include "progress.h"
#include "train_options.h"

namespace fs = std::filesystem;
using namespace ember;

namespace {

struct DataSplits {
  std::string name;
  std::shared_ptr<const data::Dataset> train, test;
  int64_t classes = 10, channels = 3;
  std::vector<float> mean, std;
  int64_t image_size = 32;
};

DataSplits load_data(const apps::TrainOptions& o) {
  std::string which = o.dataset;
  if (which == "auto")
    which = fs::exists(fs::path(o.data) / "cifar-10-batches-bin") ? "cifar10" : "fashion-mnist";
  DataSplits d;
  d.name = which;
  if (which == "cifar10") {
    d.train = std::make_shared<data::Cifar10>(o.data, data::Split::kTrain);
    d.test = std::make_shared<data::Cifar10>(o.data, data::Split::kTest);
    d.mean = {0.4914f, 0.4822f, 0.4465f};
    d.std = {0.2470f, 0.2435f, 0.2616f};
  } else if (which == "cifar100") {
    d.train = std::make_shared<data::Cifar100>(o.data, data::Split::kTrain);
    d.test = std::make_shared<data::Cifar100>(o.data, data::Split::kTest);
    d.classes = 100;
    d.mean = {0.5071f, 0.4865f, 0.4409f};
    d.std = {0.2673f, 0.2564f, 0.2762f};
  } else {
    const bool fashion = which == "fashion-mnist";
    const std::string root =
        o.dataset == "auto" || o.data == "data"
            ? std::string(fashion ? data::FashionMnist::kDefaultRoot : "data/mnist")
            : o.data;
    if (fashion) {
      d.train = std::make_shared<data::FashionMnist>(data::Split::kTrain, root);
      d.test = std::make_shared<data::FashionMnist>(data::Split::kTest, root);
      d.mean = {0.2860f};
      d.std = {0.3530f};
    } else {
      d.train = std::make_shared<data::Mnist>(root, data::Split::kTrain);
      d.test = std::make_shared<data::Mnist>(root, data::Split::kTest);
      d.mean = {0.1307f};
      d.std = {0.3081f};
    }
    d.channels = 1;
    d.image_size = 28;
  }
  return d;
}

// The newest "checkpoint-epoch-N.safetensors" in dir, or "" when there is none.
std::string latest_checkpoint(const std::string& dir) {
  if (!fs::exists(dir)) return "";
  const std::regex pattern(R"(checkpoint-epoch-(\d+)\.safetensors)");
  int64_t best = -1;
  std::string path;
  for (const auto& entry : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (std::regex_match(name, m, pattern) && std::stoll(m[1]) > best) {
      best = std::stoll(m[1]);
      path = entry.path().string();
    }
  }
  return path;
}

std::unique_ptr<optim::LRScheduler> make_schedule(const apps::TrainOptions& o,
                                                  optim::Optimizer& optimizer, double lr,
                                                  int64_t steps_per_epoch) {
  const int64_t total = o.epochs * steps_per_epoch;
  const auto warmup = static_cast<int64_t>(o.warmup_epochs * static_cast<double>(steps_per_epoch));
  if (o.schedule == "onecycle") return std::make_unique<optim::OneCycleLR>(optimizer, lr, total);
  std::unique_ptr<optim::LRScheduler> after;
  if (o.schedule == "cosine") {
    after =
        std::make_unique<optim::CosineAnnealingLR>(optimizer, std::max<int64_t>(total - warmup, 1));
  } else if (o.schedule == "step") {
    after = std::make_unique<optim::MultiStepLR>(
        optimizer, std::vector<int64_t>{total / 2 - warmup, total * 3 / 4 - warmup}, 0.1);
  }
  if (warmup == 0) {
    if (after) return after;
    return std::make_unique<optim::LambdaLR>(optimizer, [](int64_t) { return 1.0; });
  }
  return after ? std::make_unique<optim::LinearWarmup>(std::move(after), warmup)
               : std::make_unique<optim::LinearWarmup>(optimizer, warmup);
}

struct EvalResult {
  double loss = 0, accuracy = 0;
};

EvalResult evaluate(nn::Module& model, data::DataLoader& loader, Device device,
                    dist::ProcessGroup& group) {
  model.eval();
  NoGradGuard no_grad;
  double loss_sum = 0, correct = 0, count = 0;
  for (const data::Batch& batch : loader) {
    const Tensor x = batch.data.to(device, true), y = batch.target.to(device, true);
    const Tensor logits = model.forward(x);
    loss_sum += cross_entropy(logits, y, {.reduction = Reduction::kSum}).item<double>();
    correct += sum(eq(argmax(logits, 1), y)).item<double>();
    count += static_cast<double>(y.numel());
  }
  // Every rank evaluated its shard; sum the totals.
  Tensor totals = from_vector<double>({loss_sum, correct, count});
  group.allreduce(totals)->wait();
  const auto t = totals.to_vector<double>();
  model.train();
  return {t[0] / std::max(t[2], 1.0), t[1] / std::max(t[2], 1.0)};
}

void write_plot(const fs::path& metrics, const fs::path& png) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::printf("gnuplot not found: skipped the plot (apt-get install gnuplot-nox)\n");
    return;
  }
  const fs::path script = png.parent_path() / "curves.gnuplot";
  std::ofstream out(script);
  out << "set terminal png size 1000,400\nset output '" << png.string() << "'\n"
      << "set multiplot layout 1,2\nset xlabel 'epoch'\nset key bottom left\n"
      << "set datafile separator ','\n"
      << "set title 'loss'\nplot '" << metrics.string()
      << ".csv' using 1:2 with linespoints title 'train', '' using 1:4 "
      << "with linespoints title 'test'\n"
      << "set title 'accuracy'\nset key bottom right\nplot '' using 1:3 with linespoints title "
         "'train', '' using 1:5 "
      << "with linespoints title 'test'\nunset multiplot\n";
  out.close();
  // gnuplot warns about a one-point x range after a single epoch; the plot is fine.
  if (std::system(("gnuplot '" + script.string() + "' 2>/dev/null").c_str()) == 0) {
    std::printf("plot: %s\n", png.c_str());
  } else {
    std::printf("gnuplot failed: no plot (the metrics are in %s)\n", metrics.c_str());
  }
}

int run(const apps::TrainOptions& o) {
  // --- processes and devices ---------------------------------------------------------------
  const bool want_cuda =
      o.device == "cuda" || (o.device == "auto" && !o.deterministic && cuda::is_available());
  EMBER_CHECK(!want_cuda || cuda::is_available(), "ember-train",
              "--device cuda but no CUDA device is visible");
  // CPU runs repeat bit for bit for a seed (fixed reduction orders, a batch order that does
  // not depend on the worker count); cuDNN's benchmarked algorithms give no such promise.
  EMBER_CHECK(!(o.deterministic && want_cuda), "ember-train",
              "--deterministic is available on the CPU only ",
              "(cuDNN picks algorithms by timing); use --device cpu");
  if (o.threads > 0) set_num_threads(o.threads);
  dist::InitOptions init;
  init.device = want_cuda ? std::optional<Device>(cuda_device(0)) : std::optional<Device>(kCPU);
  std::shared_ptr<dist::ProcessGroup> group = dist::init_process_group(init);
  const Device device = want_cuda ? cuda_device(group->local_rank() % cuda::device_count()) : kCPU;
  const bool leader = group->rank() == 0;
  dist::RankZeroLogger log(*group);

  // --- data ----------------------------------------------------------------------------------
  const DataSplits d = load_data(o);
  auto train_transform =
      std::make_shared<data::Compose>(std::vector<std::shared_ptr<const data::Transform>>{
          std::make_shared<data::RandomCrop>(d.image_size, d.image_size, d.image_size / 8),
          std::make_shared<data::RandomHorizontalFlip>(), std::make_shared<data::ToTensor>(),
          std::make_shared<data::Normalize>(d.mean, d.std)});
  auto test_transform =
      std::make_shared<data::Compose>(std::vector<std::shared_ptr<const data::Transform>>{
          std::make_shared<data::ToTensor>(), std::make_shared<data::Normalize>(d.mean, d.std)});
  dist::DistributedSamplerOptions sampler_options;
  sampler_options.seed = o.seed;
  sampler_options.drop_last = true;
  auto train_sampler =
      std::make_shared<dist::DistributedSampler>(d.train->size(), *group, sampler_options);
  auto test_sampler = std::make_shared<dist::DistributedSampler>(
      d.test->size(), *group, dist::DistributedSamplerOptions{false, 0, false});
  data::DataLoaderOptions loader_options;
  loader_options.batch_size = o.batch_size;
  loader_options.seed = o.seed;
  loader_options.drop_last = true;
  loader_options.num_workers = o.workers;
  loader_options.pin_memory = device.is_cuda();
  loader_options.sampler = train_sampler;
  loader_options.transform = train_transform;
  data::DataLoader train_loader(d.train, loader_options);
  loader_options.drop_last = false;
  loader_options.sampler = test_sampler;
  loader_options.transform = test_transform;
  data::DataLoader test_loader(d.test, loader_options);

  // --- model, optimizer, schedule ------------------------------------------------------------
  manual_seed(o.seed);
  std::shared_ptr<nn::Module> model = nn::resnet(o.model, d.classes, d.channels);
  if (o.sync_bn && group->size() > 1) model = dist::convert_sync_batchnorm(model, group);
  model->to(device);
  std::shared_ptr<nn::Module> trained = model;
  if (group->size() > 1) {
    dist::DDPOptions ddp;
    if (o.compression == "fp16") ddp.compression = kF16;
    if (o.compression == "bf16") ddp.compression = kBF16;
    trained = std::make_shared<dist::DistributedDataParallel>(model, group, ddp);
  }
  const double lr = o.lr * static_cast<double>(o.batch_size * group->size()) / 128.0;
  std::unique_ptr<optim::Optimizer> optimizer;
  if (o.optimizer == "sgd") {
    optim::SGDOptions sgd;
    sgd.lr = lr;
    sgd.momentum = o.momentum;
    sgd.nesterov = o.momentum > 0;
    sgd.weight_decay = o.weight_decay;
    optimizer = std::make_unique<optim::SGD>(model->parameters(), sgd);
  } else {
    optim::AdamWOptions adamw;
    adamw.lr = lr;
    adamw.weight_decay = o.weight_decay;
    optimizer = std::make_unique<optim::AdamW>(model->parameters(), adamw);
  }
  const int64_t steps_per_epoch = train_loader.size();
  EMBER_CHECK(steps_per_epoch > 0, "ember-train", "the training split (", d.train->size(),
              " images over ", group->size(), " ranks) holds no full batch of ", o.batch_size);
  std::unique_ptr<optim::LRScheduler> schedule = make_schedule(o, *optimizer, lr, steps_per_epoch);

  // --- resume ---------------------------------------------------------------------------------
  dist::Checkpoint state;
  state.model = model.get();
  state.optimizer = optimizer.get();
  state.scheduler = schedule.get();
  state.generators = {{"default", &default_generator()}};
  state.sampler = train_sampler.get();
  int64_t first_epoch = 0, step = 0;
  if (o.resume) {
    const std::string path = latest_checkpoint(o.checkpoint_dir);
    if (path.empty()) {
      log.log("no checkpoint in " + o.checkpoint_dir + ": starting from scratch");
    } else {
      dist::load_checkpoint(path, state, device);
      first_epoch = state.epoch;
      step = state.step;
      log.log("resumed from " + path + " at epoch " + std::to_string(first_epoch + 1));
    }
  }

  fs::path metrics_path;
  std::ofstream metrics, metrics_csv;
  if (leader) {
    fs::create_directories(o.out_dir);
    metrics_path = fs::path(o.out_dir) / "metrics.jsonl";
    metrics.open(metrics_path, first_epoch > 0 ? std::ios::app : std::ios::trunc);
    metrics_csv.open(metrics_path.string() + ".csv",
                     first_epoch > 0 ? std::ios::app : std::ios::trunc);
  }
  log.log("ember-train: " + o.model + " on " + d.name + " (" + std::to_string(d.train->size()) +
          " train / " + std::to_string(d.test->size()) + " test), " +
          std::to_string(group->size()) + " rank(s) on " + device.str() + " (" + group->backend() +
          "), batch " + std::to_string(o.batch_size) + " per rank, " + std::to_string(o.epochs) +
          " epochs");

  // --- train ----------------------------------------------------------------------------------
  apps::Progress progress(leader, o.log_interval);
  const auto run_start = std::chrono::steady_clock::now();
  EvalResult last_eval;
  bool stop = false;
  for (int64_t epoch = first_epoch; epoch < o.epochs && !stop; ++epoch) {
    train_loader.set_epoch(static_cast<uint64_t>(epoch));
    progress.start_epoch(epoch, o.epochs, steps_per_epoch);
    const auto epoch_start = std::chrono::steady_clock::now();
    double loss_sum = 0, correct = 0, seen = 0;
    int64_t images = 0, batches = 0;
    trained->train();
    for (const data::Batch& batch : train_loader) {
      const Tensor x = batch.data.to(device, true), y = batch.target.to(device, true);
      optimizer->zero_grad();
      const Tensor logits = trained->forward(x);
      const Tensor loss = cross_entropy(logits, y, {.label_smoothing = o.label_smoothing});
      loss.backward();
      optimizer->step();
      schedule->step();
      ++step;
      ++batches;
      const double loss_value = loss.item<double>();
      loss_sum += loss_value * static_cast<double>(y.numel());
      {
        NoGradGuard no_grad;
        correct += sum(eq(argmax(logits, 1), y)).item<double>();
      }
      seen += static_cast<double>(y.numel());
      images += y.numel() * group->size();
      progress.update(batches, images, loss_value);
      if (o.max_steps > 0 && step >= o.max_steps) {
        stop = true;
        break;
      }
    }
    progress.finish_epoch();
    const double epoch_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - epoch_start).count();
    const auto train_stats = dist::average_across_ranks(
        {{"loss", loss_sum / std::max(seen, 1.0)}, {"accuracy", correct / std::max(seen, 1.0)}},
        *group);
    last_eval = evaluate(*trained, test_loader, device, *group);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    const double rate = static_cast<double>(images) / epoch_seconds;
    if (leader) {
      char line[512];
      std::snprintf(
          line, sizeof line,
          "{\"epoch\": %ld, \"train_loss\": %.5f, \"train_accuracy\": %.5f, \"test_loss\": %.5f, "
          "\"test_accuracy\": %.5f, \"images_per_s\": %.1f, \"lr\": %.6g, \"epoch_s\": %.1f, "
          "\"elapsed_s\": %.1f}",
          static_cast<long>(epoch + 1), train_stats.at("loss"), train_stats.at("accuracy"),
          last_eval.loss, last_eval.accuracy, rate, schedule->get_last_lr()[0], epoch_seconds,
          elapsed);
      metrics << line << "\n" << std::flush;
      metrics_csv << epoch + 1 << "," << train_stats.at("loss") << "," << train_stats.at("accuracy")
                  << "," << last_eval.loss << "," << last_eval.accuracy << "\n"
                  << std::flush;
      std::printf(
          "epoch %ld/%ld: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.0f img/s | "
          "%s\n",
          static_cast<long>(epoch + 1), static_cast<long>(o.epochs), train_stats.at("loss"),
          100 * train_stats.at("accuracy"), last_eval.loss, 100 * last_eval.accuracy, rate,
          apps::format_duration(epoch_seconds).c_str());
      std::fflush(stdout);
    }
    if (!o.checkpoint_dir.empty() &&
        ((epoch + 1) % o.checkpoint_interval == 0 || epoch + 1 == o.epochs || stop)) {
      if (leader) fs::create_directories(o.checkpoint_dir);
      state.epoch = epoch + 1;
      state.step = step;
      const std::string path = (fs::path(o.checkpoint_dir) /
                                ("checkpoint-epoch-" + std::to_string(epoch + 1) + ".safetensors"))
                                   .string();
      dist::save_checkpoint(path, state, group.get());
      log.log("checkpoint: " + path);
    }
  }
  if (leader) {
    metrics.close();
    metrics_csv.close();
    write_plot(metrics_path, fs::path(o.out_dir) / "curves.png");
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    std::printf("done: %ld steps in %s, final test accuracy %.2f%% (metrics: %s)\n",
                static_cast<long>(step), apps::format_duration(total).c_str(),
                100 * last_eval.accuracy, metrics_path.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  apps::TrainOptions options;
  if (const int code = apps::parse_train_options(argc, argv, options); code >= 0) return code;
  try {
    return run(options);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // ember::Error names the operation
    return 1;
  }
}

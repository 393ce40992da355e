// ember-train: trains a ResNet with ember's own stack (apps::Trainer) on a built-in data set
// or an image folder, or a GPT on text (--model gpt), with a schedule laid out over the run's
// steps, and evaluates it. `ember-train sample` continues a prompt from a GPT snapshot.
//
// Runs alone, under `mpirun -np N`, `srun`, or with torchrun-style variables: rank 0 alone
// prints and writes. See README.md for the recipes.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include <ember/dist/amp.h>
#include <ember/dist/checkpoint.h>
#include <ember/dist/ddp.h>
#include <ember/dist/distributed_sampler.h>
#include <ember/dist/init.h>
#include <ember/dist/metrics.h>
#include <ember/dist/sync_batch_norm.h>
#include <ember/dist/window_sampler.h>
#include <ember/dist/zero.h>
#include <ember/ember.h>
#include <ember/optim/param_groups.h>

#include "data_setup.h"
#include "gpt_setup.h"
#include "metrics_log.h"
#include "precision.h"
#include "progress.h"
#include "schedule.h"
#include "train_options.h"
#include "trainer.h"

namespace fs = std::filesystem;
using namespace ember;

namespace {

int run(const apps::TrainOptions& options) {
  apps::TrainOptions o = options;
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
  if (const int threads = apps::threads_to_set(o.threads); threads > 0) set_num_threads(threads);
  dist::InitOptions init;
  init.device = want_cuda ? std::optional<Device>(cuda_device(0)) : std::optional<Device>(kCPU);
  std::shared_ptr<dist::ProcessGroup> group = dist::init_process_group(init);
  const Device device = want_cuda ? cuda_device(group->local_rank() % cuda::device_count()) : kCPU;
  const bool leader = group->rank() == 0;
  dist::RankZeroLogger log(*group);
  o.batch_size = apps::per_rank_batch(o, group->size());  // --global-batch-size / world size

  // --- data ----------------------------------------------------------------------------------
  const apps::DataSplits d = apps::load_data(o);
  dist::DistributedSamplerOptions sampler_options;
  sampler_options.seed = o.seed;
  sampler_options.drop_last = true;
  std::shared_ptr<dist::DistributedSampler> train_sampler, test_sampler;
  if (apps::is_gpt(o)) {
    // Random windows: an epoch holds the training tokens about once (or --windows-per-epoch);
    // evaluation sees the same eval_windows validation windows each time.
    const int64_t windows =
        o.windows_per_epoch > 0
            ? o.windows_per_epoch
            : std::max<int64_t>(d.train->size() / o.block_size, o.batch_size * group->size());
    train_sampler = std::make_shared<dist::DistributedWindowSampler>(
        d.train->size(), std::min(windows, d.train->size()), *group,
        dist::WindowSamplerOptions{o.seed, true});
    test_sampler = std::make_shared<dist::DistributedWindowSampler>(
        d.test->size(), std::min(o.eval_windows, d.test->size()), *group,
        dist::WindowSamplerOptions{o.seed + 1, false});
  } else {
    train_sampler =
        std::make_shared<dist::DistributedSampler>(d.train->size(), *group, sampler_options);
    test_sampler = std::make_shared<dist::DistributedSampler>(
        d.test->size(), *group, dist::DistributedSamplerOptions{false, 0, false});
  }
  data::DataLoaderOptions loader_options;
  loader_options.batch_size = o.batch_size;
  loader_options.seed = o.seed;
  loader_options.drop_last = true;
  loader_options.num_workers = o.workers;
  loader_options.pin_memory = device.is_cuda();
  loader_options.sampler = train_sampler;
  loader_options.transform = apps::train_transform(d);
  data::DataLoader train_loader(d.train, loader_options);
  loader_options.drop_last = false;
  loader_options.sampler = test_sampler;
  loader_options.transform = apps::test_transform(d);
  data::DataLoader test_loader(d.test, loader_options);

  // --- model, optimizer, schedule ------------------------------------------------------------
  // The default generator starts from a fresh seed in each process: --seed (0 by default)
  // makes the weights and the dropout masks repeat from run to run.
  manual_seed(o.seed);
  std::shared_ptr<nn::Module> model;
  nn::GPTConfig gpt;
  if (apps::is_gpt(o)) {
    gpt = apps::gpt_config(o, d.classes);
    model = std::make_shared<nn::GPT>(gpt);
  } else {
    model = nn::resnet(o.model, d.classes, d.channels);
  }
  if (o.dtype == "f64") model->to(kF64);  // the Trainer casts the batches to match
  if (o.sync_bn && group->size() > 1) model = dist::convert_sync_batchnorm(model, group);
  model->to(device);
  // Batches stay NCHW: the first convolution lays its input out as its weight's format.
  if (apps::use_channels_last(o, device.is_cuda())) model->to(MemoryFormat::ChannelsLast);
  std::shared_ptr<nn::Module> trained = model;
  if (group->size() > 1) {
    dist::DDPOptions ddp;
    if (o.compression == "fp16") ddp.compression = kF16;
    if (o.compression == "bf16") ddp.compression = kBF16;
    trained = std::make_shared<dist::DistributedDataParallel>(model, group, ddp);
  }
  // ResNet recipes give the lr of a global batch of 128 (scaled linearly); a GPT's is its own.
  const double lr =
      apps::is_gpt(o) ? o.lr : o.lr * static_cast<double>(o.batch_size * group->size()) / 128.0;
  dist::OptimizerFactory make_optimizer;
  const std::vector<optim::ParamGroup> groups =
      apps::is_gpt(o)
          ? optim::weight_decay_groups(*model, o.weight_decay, apps::weight_decay_rule(o))
          : apps::parameter_groups(*model, o.no_decay_norm_bias);
  if (o.optimizer == "sgd") {
    optim::SGDOptions sgd;
    sgd.lr = lr;
    sgd.momentum = o.momentum;
    sgd.nesterov = o.momentum > 0;
    sgd.weight_decay = o.weight_decay;
    make_optimizer = dist::optimizer_factory<optim::SGD>(sgd);
  } else {
    optim::AdamWOptions adamw;
    adamw.lr = lr;
    adamw.weight_decay = o.weight_decay;
    if (apps::is_gpt(o)) adamw.betas = {0.9, 0.95};
    make_optimizer = dist::optimizer_factory<optim::AdamW>(adamw);
  }
  // --zero 1: each rank steps its shard of the parameters; 2: DDP also reduces each gradient to
  // its shard's rank only.
  std::unique_ptr<optim::Optimizer> optimizer;
  auto* ddp = dynamic_cast<dist::DistributedDataParallel*>(trained.get());
  if (o.zero > 0 && ddp != nullptr) {
    auto zero = std::make_unique<dist::ZeroRedundancyOptimizer>(groups, make_optimizer, group);
    if (o.zero == 2) zero->shard_gradients(*ddp);
    optimizer = std::move(zero);
  } else {
    optimizer = make_optimizer(groups);
  }
  const int64_t steps_per_epoch = train_loader.size();
  EMBER_CHECK(steps_per_epoch > 0, "ember-train", "the training split (", d.train->size(),
              " images over ", group->size(), " ranks) holds no full batch of ", o.batch_size);
  const apps::SchedulePlan plan = apps::plan_schedule(o, steps_per_epoch);
  std::unique_ptr<optim::LRScheduler> schedule =
      apps::make_schedule(o.schedule, *optimizer, lr, plan);

  // --- precision: autocast and loss scaling around an f32 model (see precision.h) -----------
  const apps::Precision precision = apps::resolve_precision(o.precision, device);
  apps::PrecisionContext amp(precision, device,
                             group->size() > 1 ? dist::make_found_inf_agreement(group)
                                               : optim::GradScaler::FoundInfReducer{});

  // --- snapshots --------------------------------------------------------------------------
  dist::Checkpoint state;
  state.grad_scaler = amp.scaler();
  state.model = model.get();
  state.optimizer = optimizer.get();
  state.scheduler = schedule.get();
  state.generators = {{"default", &default_generator()}};
  state.sampler = train_sampler.get();
  if (apps::is_gpt(o)) state.texts = apps::gpt_texts(gpt, *d.vocabulary);
  // A resumed run continues its metrics files (records after its snapshot are dropped).
  apps::MetricsLog metrics(o.out_dir, leader, !o.resume.empty(),
                           apps::is_gpt(o) ? "tokens_per_s" : "images_per_s");
  metrics.set_precision(&amp);
  apps::Progress progress(leader, o.log_interval, apps::is_gpt(o) ? "tok" : "img");
  apps::Trainer trainer(o, *model, *trained, *optimizer, schedule.get(), *group, device);
  trainer.attach(train_loader, test_loader, &state, metrics, progress);
  trainer.set_precision(&amp);
  const int64_t first_epoch = trainer.resume();
  if (!o.resume.empty()) metrics.drop_after(trainer.step());

  const std::string what =
      apps::is_gpt(o)
          ? "gpt (" + std::to_string(nn::parameter_count(*model)) +
                " parameters: " + std::to_string(o.n_layer) + " layers, " +
                std::to_string(o.n_head) + " heads, " + std::to_string(o.n_embd) + " wide, block " +
                std::to_string(o.block_size) + ") on " + d.name + " (" + std::to_string(d.tokens) +
                " " + o.tokens + " tokens, vocabulary " + std::to_string(d.classes) + ")"
          : o.model + " on " + d.name + " (" + std::to_string(d.train->size()) + " train / " +
                std::to_string(d.test->size()) + " test, " + std::to_string(d.classes) +
                " classes)";
  // --max-steps shorter than the epochs asked for ends the run first: say so, not the epochs.
  const bool cut_short = o.max_steps > 0 && o.max_steps < o.epochs * steps_per_epoch;
  const std::string length = cut_short ? std::to_string(o.max_steps) + " steps (--max-steps)"
                                       : std::to_string(o.epochs) + " epochs";
  log.log("ember-train: " + what + ", " + std::to_string(group->size()) + " rank(s) on " +
          device.str() + " (" + group->backend() + ")" +
          (device.is_cuda() ? "" : ", " + std::to_string(get_num_threads()) + " thread(s) each") +
          ", batch " + std::to_string(o.batch_size) + " per rank" +
          (o.global_batch_size > 0
               ? " (--global-batch-size " + std::to_string(o.global_batch_size) + ")"
               : "") +
          (o.accum_steps > 1 ? " in " + std::to_string(o.accum_steps) + " micro-batches" : "") +
          ", " + length + ", precision " + amp.name() +
          (o.zero > 0 && ddp != nullptr ? ", ZeRO-" + std::to_string(o.zero) : "") +
          (apps::use_channels_last(o, device.is_cuda()) ? ", channels_last" : ""));
  char plan_line[256];
  std::snprintf(plan_line, sizeof plan_line,
                "schedule: %s over %ld steps (%ld per epoch), peak lr %.4g after %ld warm-up "
                "steps%s",
                o.schedule.c_str(), static_cast<long>(plan.total_steps),
                static_cast<long>(steps_per_epoch), lr, static_cast<long>(plan.warmup_steps),
                plan.warmup_capped ? " (capped to 30% of the run)" : "");
  log.log(plan_line);
  if (!d.bad_files.empty()) {
    log.log("left out " + std::to_string(d.bad_files.size()) +
            " image(s) that do not decode (--bad-images skip):");
    for (const std::string& bad : d.bad_files) log.log("  " + bad);
  }
  if (d.resize) {
    char stats[256];
    std::snprintf(stats, sizeof stats, "normalisation: mean %.4f %.4f %.4f, std %.4f %.4f %.4f%s",
                  d.mean[0], d.mean[1], d.mean[2], d.std[0], d.std[1], d.std[2],
                  o.mean.empty() ? " (measured on the training split)" : "");
    log.log(stats);
  }

  // --- train ----------------------------------------------------------------------------------
  const auto run_start = std::chrono::steady_clock::now();
  const apps::EvalResult last_eval = trainer.train(first_epoch);
  if (leader) {
    const std::string png = metrics.plot(steps_per_epoch, trainer.step());
    if (!png.empty()) std::printf("plot: %s\n", png.c_str());
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    std::printf("done: %ld steps in %s, final test accuracy %.2f%%, test loss %.4f (metrics: %s)\n",
                static_cast<long>(trainer.step()), apps::format_duration(total).c_str(),
                100 * last_eval.accuracy, last_eval.loss, metrics.jsonl_path().c_str());
    if (!d.bad_files.empty())
      std::printf("skipped %zu image(s) that do not decode (listed at the start)\n",
                  d.bad_files.size());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  apps::TrainOptions options;
  apps::SampleOptions sample;
  bool sampling = false;
  if (const int code = apps::parse_train_options(argc, argv, options, &sample, &sampling);
      code >= 0)
    return code;
  try {
    return sampling ? apps::run_sample(sample) : run(options);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());  // ember::Error names the operation
    return 1;
  }
}

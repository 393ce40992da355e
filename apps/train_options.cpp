#include "train_options.h"

#include <ember/tensor/error.h>
#include <ember/tensor/parallel.h>
#include <ember/tensor/version.h>
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace ember::apps {

namespace {
// CLI11's own range checks print the whole double range; these say what is wanted.
CLI::Validator at_least(double minimum, const char* what) {
  return CLI::Validator(
      [minimum, what](std::string& value) -> std::string {
        try {
          if (std::stod(value) >= minimum) return "";
        } catch (const std::exception&) {
        }
        return "'" + value + "' is not " + what;
      },
      what);
}
const CLI::Validator kPositive = at_least(1e-300, "a positive number");
const CLI::Validator kNonNegative = at_least(0.0, "a non-negative number");
}  // namespace

int threads_to_set(int threads) {
  if (threads > 0) return threads;
  const char* omp = std::getenv("OMP_NUM_THREADS");
  if (omp != nullptr && omp[0] != '\0') return 0;
  for (const char* name : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    const char* value = std::getenv(name);
    if (value != nullptr && std::atoi(value) > 0) return cpu_share(std::atoi(value));
  }
  return 0;
}

int parse_train_options(int argc, char** argv, TrainOptions& o, SampleOptions* sample,
                        bool* sampling) {
  CLI::App app{
      "ember-train: train a ResNet on CIFAR-10/100, (Fashion-)MNIST or a folder of your images, on "
      "one CPU, one GPU or many ranks under mpirun/srun/torchrun"};
  app.set_version_flag("--version", "ember-train " + std::string(ember::version()),
                       "Print ember's version and exit");
  app.add_option("--data", o.data,
                 "Folder holding cifar-10-batches-bin/, cifar-100-binary/, or (--dataset folder) "
                 "train/CLASS/*.png|jpg and val/CLASS/...");
  app.add_option("--dataset", o.dataset,
                 "auto: CIFAR-10 when present under --data, else Fashion-MNIST; folder: your "
                 "images in class subfolders")
      ->check(CLI::IsMember(
          {"auto", "cifar10", "cifar100", "fashion-mnist", "mnist", "folder", "text"}));
  app.add_option("--image-size", o.image_size,
                 "--dataset folder: shorter side resized to this, then cropped square")
      ->check(kPositive);
  app.add_option("--bad-images", o.bad_images,
                 "--dataset folder: an image that does not decode ends the run naming it (fail), "
                 "or is left out, named and counted in the summary (skip)")
      ->check(CLI::IsMember({"fail", "skip"}));
  app.add_option("--mean", o.mean,
                 "--dataset folder: per-channel mean (R G B) in [0, 1]; default: measured once "
                 "over the training split")
      ->expected(3);
  app.add_option("--std", o.std, "--dataset folder: per-channel standard deviation (R G B)")
      ->expected(3)
      ->check(kPositive);
  app.add_option("--model", o.model,
                 "resnet20|32|56|110, resnet18|34 (CIFAR stem), resnet18-imagenet ..., or gpt "
                 "(a transformer language model on --data text)");
  app.add_option("--epochs", o.epochs)->check(kPositive);
  app.add_option("--batch-size", o.batch_size, "Images per rank and step")->check(kPositive);
  app.add_option("--global-batch-size", o.global_batch_size,
                 "Images per step over all ranks: each rank takes this / the number of ranks, "
                 "so a run resumed on another number of ranks keeps its recipe")
      ->check(kPositive)
      ->excludes("--batch-size");
  app.add_option("--optimizer", o.optimizer)->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--lr", o.lr, "Learning rate for a global batch of 128 (scaled linearly)")
      ->check(kPositive);
  app.add_option("--momentum", o.momentum)->check(CLI::Range(0.0, 1.0));
  app.add_option("--weight-decay", o.weight_decay)->check(kNonNegative);
  app.add_option("--schedule", o.schedule,
                 "Over the run's optimizer steps: onecycle (PyTorch's OneCycleLR), cosine or step "
                 "after a linear warm-up, or constant")
      ->check(CLI::IsMember({"cosine", "warmup-cosine", "onecycle", "step", "constant"}));
  app.add_option("--warmup-epochs", o.warmup_epochs,
                 "Warm-up length (default: 30% of the run for onecycle, 1 epoch otherwise; "
                 "never more than 30% of the run)")
      ->check(kNonNegative);
  app.add_option("--warmup-steps", o.warmup_steps, "Warm-up length in steps (wins over epochs)")
      ->check(kNonNegative);
  app.add_option("--label-smoothing", o.label_smoothing)->check(CLI::Range(0.0, 1.0));
  app.add_option("--device", o.device)->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--precision", o.precision,
                 "fp32 | tf32 | bf16 (autocast) | fp16 (autocast + loss scaling); auto: bf16 on "
                 "a GPU of compute capability 8.0 or later, else fp32")
      ->check(CLI::IsMember({"auto", "fp32", "tf32", "bf16", "fp16"}));
  app.add_option("--dtype", o.dtype,
                 "f32, or f64 for the parameters and batches (as model.double(); --precision "
                 "fp32 only)")
      ->check(CLI::IsMember({"f32", "f64"}));
  app.add_option("--threads", o.threads,
                 "CPU threads per rank (0: OMP_NUM_THREADS when set, else under a launcher "
                 "(ember-run, torchrun, mpirun) this rank's share of the node's CPUs, else all)")
      ->check(kNonNegative);
  app.add_option("--workers", o.workers, "Data-loading threads")->check(kNonNegative);
  app.add_option("--seed", o.seed,
                 "Seed of the weights' initialisation, dropout, shuffling and augmentation "
                 "(default 0: runs repeat unless it is changed)");
  app.add_flag("--deterministic", o.deterministic,
               "Bit-for-bit repeatable runs for a seed (CPU only)");
  app.add_option(
      "--checkpoint-dir", o.checkpoint_dir,
      "Where snapshots go: checkpoint-epoch-N.safetensors, checkpoint-step-S.safetensors "
      "(under --zero: sharded snapshots, folders of those names without the extension; "
      "default: none, or --out-dir with --save-every-steps or --resume)");
  app.add_option("--checkpoint-interval", o.checkpoint_interval, "Epochs between snapshots")
      ->check(kPositive);
  app.add_option("--save-every-steps", o.save_every_steps,
                 "Also a snapshot every this many optimizer steps, mid-epoch included (0: off)")
      ->check(kNonNegative);
  app.add_option("--keep", o.keep,
                 "Keep only the newest this many snapshots, deleting older ones after each save "
                 "(0: all)")
      ->check(kNonNegative);
  app.add_option(
         "--resume", o.resume,
         "Continue exactly where a snapshot left off (mid-epoch included). auto (also a "
         "bare --resume): the newest snapshot in --checkpoint-dir that loads, a damaged one "
         "skipped with a warning, or a fresh start when there is none (what a restarted "
         "worker wants); or a snapshot file")
      ->expected(0, 1)
      ->default_str("auto");
  app.add_flag("--sync-bn", o.sync_bn, "Batch statistics over all ranks (SyncBatchNorm)");
  app.add_option("--compression", o.compression, "Gradient traffic: none, fp16 or bf16")
      ->check(CLI::IsMember({"none", "fp16", "bf16"}));
  app.add_option("--zero", o.zero,
                 "Shard the optimizer state across ranks (1, ZeroRedundancyOptimizer) and also "
                 "the gradients (2); snapshots are sharded (each rank writes its part), and a "
                 "run resumes from either kind with or without it, on any number of ranks")
      ->check(CLI::IsMember({0, 1, 2}));
  app.add_option("--max-steps", o.max_steps,
                 "Stop after this many steps; the schedule fits them (smoke runs, step budgets)")
      ->check(kNonNegative);
  app.add_option("--out-dir", o.out_dir, "Folder for metrics.jsonl and curves.png");
  app.add_option("--log-interval", o.log_interval, "Steps between log lines when not on a terminal")
      ->check(kPositive);
  app.add_option("--log-every", o.log_every,
                 "Steps between records in metrics.jsonl (0: steps per epoch / 50)")
      ->check(kNonNegative);
  app.add_option(
         "--eval-every-steps", o.eval_every_steps,
         "Also evaluate every this many steps (0: after each epoch, and every quarter of a run "
         "shorter than 4 epochs, --max-steps runs excepted)")
      ->check(kNonNegative);
  app.add_option("--accum-steps", o.accum_steps,
                 "Run each batch as this many micro-batches, one optimizer step per batch "
                 "(gradient accumulation: the same recipe in less memory)")
      ->check(kPositive);
  app.add_option("--grad-clip", o.grad_clip,
                 "Clip the gradients' joint L2 norm to this (clip_grad_norm_; 0: off)")
      ->check(kNonNegative);
  app.add_flag("--no-decay-norm-bias", o.no_decay_norm_bias,
               "No weight decay on normalisation weights and biases (1-d parameters)");
  app.add_flag_callback(
      "--channels-last", [&o] { o.channels_last = 1; },
      "Train in channels_last (NHWC) memory format (default on CUDA)");
  app.add_flag_callback(
      "--no-channels-last", [&o] { o.channels_last = 0; }, "Train in NCHW (default on the CPU)");
  app.add_flag("--cuda-graphs", o.cuda_graphs,
               "Capture the whole training step (forward, loss, backward, clipping, fp16 loss "
               "scaling and the optimizer step) in a CUDA graph after warm-up steps and replay "
               "it (one process on CUDA; otherwise it says why and runs eagerly)");
  app.add_option("--trace", o.trace,
                 "Write a Chrome Trace Event JSON of the steps from --trace-start to --trace-end "
                 "of every rank to this file (open it in ui.perfetto.dev), and print how much "
                 "all-reduce time backward hid");
  app.add_option("--trace-start", o.trace_start, "The first traced step (counted from 0)")
      ->check(kNonNegative);
  app.add_option("--trace-end", o.trace_end, "The step after the last traced one")
      ->check(kPositive);
  app.add_option("--n-layer", o.n_layer, "--model gpt: transformer blocks")->check(kPositive);
  app.add_option("--n-head", o.n_head, "--model gpt: attention heads")->check(kPositive);
  app.add_option("--n-embd", o.n_embd, "--model gpt: width (a multiple of --n-head)")
      ->check(kPositive);
  app.add_option("--block-size", o.block_size, "--model gpt: context length in tokens")
      ->check(kPositive);
  app.add_option("--dropout", o.dropout, "--model gpt: dropout probability")
      ->check(CLI::Range(0.0, 0.99));
  app.add_option("--tokens", o.tokens, "--model gpt: char (UTF-8 characters) or byte tokens")
      ->check(CLI::IsMember({"char", "byte"}));
  app.add_option("--windows-per-epoch", o.windows_per_epoch,
                 "--model gpt: random windows per epoch over all ranks (0: the training tokens "
                 "once over)")
      ->check(kNonNegative);
  app.add_option("--eval-windows", o.eval_windows, "--model gpt: validation windows per evaluation")
      ->check(kPositive);
  app.add_option("--decay-rule", o.decay_rule,
                 "--model gpt: which parameters take weight decay: nanogpt (nanoGPT's "
                 "configure_optimizers: every parameter of 2 or more dims, the embeddings "
                 "included) or mingpt (minGPT's: not the embeddings, norms or biases)")
      ->check(CLI::IsMember({"nanogpt", "mingpt"}));

  SampleOptions ignored;
  SampleOptions& s = sample != nullptr ? *sample : ignored;
  CLI::App* sample_command =
      app.add_subcommand("sample", "Continue a prompt with a GPT snapshot and print the text");
  sample_command->add_option("--checkpoint", s.checkpoint, "A snapshot of an --model gpt run")
      ->required();
  sample_command->add_option("--prompt", s.prompt, "Text to continue (default: a newline)");
  sample_command->add_option("--tokens", s.tokens, "New tokens per sample")->check(kPositive);
  sample_command->add_option("--samples", s.samples, "How many samples")->check(kPositive);
  sample_command->add_option("--temperature", s.temperature, "0: the most likely token")
      ->check(kNonNegative);
  sample_command->add_option("--top-k", s.top_k, "Draw among the k most likely (0: all)")
      ->check(kNonNegative);
  sample_command->add_option("--seed", s.seed, "Seed of the draws (default 0: repeatable)");
  sample_command->add_option("--device", s.device)->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (sampling != nullptr) *sampling = sample_command->parsed();
  if (sample_command->parsed()) return -1;
  auto unset = [&app](const char* name) { return app.count(name) == 0; };
  if (!is_gpt(o) && unset("--label-smoothing")) o.label_smoothing = 0.1;  // the ResNet recipe's
  if (is_gpt(o)) {
    // nanoGPT's recipe where the command line is silent.
    if (unset("--dataset")) o.dataset = "text";
    if (unset("--data")) o.data = "fortunes";
    if (unset("--optimizer")) o.optimizer = "adamw";
    if (unset("--lr")) o.lr = 6e-4;
    if (unset("--weight-decay")) o.weight_decay = 0.1;
    if (unset("--schedule")) o.schedule = "warmup-cosine";
    if (unset("--grad-clip")) o.grad_clip = 1.0;
    if (unset("--batch-size")) o.batch_size = 64;
    if (o.dataset != "text") {
      std::fprintf(stderr, "ember-train: --model gpt trains on --dataset text, not %s\n",
                   o.dataset.c_str());
      return 2;
    }
    if (o.n_embd % o.n_head != 0) {
      std::fprintf(stderr, "ember-train: --n-embd %ld is not a multiple of --n-head %ld\n",
                   static_cast<long>(o.n_embd), static_cast<long>(o.n_head));
      return 2;
    }
  } else if (o.dataset == "text") {
    std::fprintf(stderr, "ember-train: --dataset text needs --model gpt\n");
    return 2;
  } else if (app.count("--decay-rule") > 0) {
    std::fprintf(stderr,
                 "ember-train: --decay-rule applies to --model gpt (for %s: "
                 "--no-decay-norm-bias)\n",
                 o.model.c_str());
    return 2;
  }
  if (o.checkpoint_dir.empty() && (o.save_every_steps > 0 || !o.resume.empty()))
    o.checkpoint_dir = o.out_dir;  // snapshots beside the metrics
  if (o.global_batch_size > 0 && o.global_batch_size % o.accum_steps != 0) {
    std::fprintf(stderr,
                 "ember-train: --global-batch-size %ld is not a multiple of --accum-steps %ld\n",
                 static_cast<long>(o.global_batch_size), static_cast<long>(o.accum_steps));
    return 2;
  }
  if (o.global_batch_size == 0 && o.batch_size % o.accum_steps != 0) {
    std::fprintf(stderr,
                 "ember-train: --batch-size %ld is not a multiple of --accum-steps %ld (each "
                 "batch is split into equal micro-batches)\n",
                 static_cast<long>(o.batch_size), static_cast<long>(o.accum_steps));
    return 2;
  }
  if (o.dtype == "f64" && o.precision != "fp32" && o.precision != "auto") {
    std::fprintf(stderr, "ember-train: --dtype f64 runs in --precision fp32, not %s\n",
                 o.precision.c_str());
    return 2;
  }
  if (o.dtype == "f64") o.precision = "fp32";  // no autocast, no TF32 around f64
  if (o.trace_end <= o.trace_start) {
    std::fprintf(stderr, "ember-train: --trace-end %ld must be after --trace-start %ld\n",
                 static_cast<long>(o.trace_end), static_cast<long>(o.trace_start));
    return 2;
  }
  if (o.mean.empty() != o.std.empty()) {
    std::fprintf(stderr, "ember-train: give --mean and --std together\n");
    return 2;
  }
  return -1;
}

int64_t per_rank_batch(const TrainOptions& options, int world_size) {
  const int64_t global = options.global_batch_size;
  if (global <= 0) return options.batch_size;
  EMBER_CHECK(global % world_size == 0, "ember-train", "--global-batch-size ", global,
              " does not divide among ", world_size, " ranks; give a multiple of ", world_size,
              " (or run on a number of ranks that divides ", global, ")");
  const int64_t each = global / world_size;
  EMBER_CHECK(each % options.accum_steps == 0, "ember-train", "--global-batch-size ", global,
              " gives ", each, " per rank on ", world_size, " ranks, which does not split into ",
              "--accum-steps ", options.accum_steps, " equal micro-batches");
  return each;
}

}  // namespace ember::apps

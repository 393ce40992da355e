// ember-train's training loop, in the shape of PyTorch's fault-tolerance tutorial Trainer:
// run_batch (one optimizer step), run_epoch, save_snapshot and train, each usable alone.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include <ember/data/dataloader.h>
#include <ember/dist/checkpoint.h>
#include <ember/dist/process_group.h>
#include <ember/nn/module.h>
#include <ember/optim/lr_scheduler.h>
#include <ember/optim/optimizer.h>

#include "metrics_log.h"
#include "precision.h"
#include "progress.h"
#include "train_options.h"

namespace ember::apps {

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// What run_batch saw on this rank.
struct BatchResult {
  double loss = 0;     // the batch's mean loss (over all its micro-batches)
  double correct = 0;  // samples classified right (argmax of the logits)
  int64_t count = 0;   // samples
};

// The optimizer's parameter groups. no_decay_norm_bias: the weights of convolutions and
// linear layers in group 0, and normalisation weights and every bias (the 1-d parameters)
// in group 1 with weight_decay 0, as timm and most ImageNet recipes do; otherwise one group.
std::vector<optim::ParamGroup> parameter_groups(const nn::Module& model, bool no_decay_norm_bias);

class Trainer {
 public:
  // model: the bare module (its parameters are clipped); trained: what forward runs, the
  // model itself or its DistributedDataParallel wrapper. schedule may be null (a fixed lr).
  // Uses options.accum_steps, grad_clip, label_smoothing, max_steps, log_every,
  // eval_every_steps, checkpoint_dir and checkpoint_interval.
  Trainer(const TrainOptions& options, nn::Module& model, nn::Module& trained,
          optim::Optimizer& optimizer, optim::LRScheduler* schedule, dist::ProcessGroup& group,
          Device device);

  // One optimizer step on `batch`: options.accum_steps equal micro-batches, each loss scaled
  // by 1 / accum_steps so the gradients are those of the whole batch's mean loss (under DDP
  // the first accum_steps - 1 backward passes run inside no_sync(), so gradients are averaged
  // across ranks once); then the gradients' L2 norm is clipped to options.grad_clip (when
  // > 0), the optimizer steps and the schedule steps.
  BatchResult run_batch(const data::Batch& batch);

  // What run_epoch, evaluate, save_snapshot and train use; the trainer does not own them.
  // checkpoint may be null (no snapshots).
  void attach(data::DataLoader& train_loader, data::DataLoader& test_loader,
              dist::Checkpoint* checkpoint, MetricsLog& metrics, Progress& progress);

  // Loss and accuracy on the test loader, summed over every rank's shard.
  EvalResult evaluate();
  // One pass over the training loader: metrics every log_every steps, an evaluation every
  // eval_every_steps, the epoch record at the end. False when max_steps ended the run.
  bool run_epoch(int64_t epoch);
  // checkpoint-epoch-<epoch + 1>.safetensors in checkpoint_dir (all ranks take part).
  void save_snapshot(int64_t epoch);
  // Epochs first_epoch .. options.epochs - 1 (or until max_steps), snapshots as asked.
  EvalResult train(int64_t first_epoch);

  // Mixed precision for run_batch and evaluate (not owned; null: plain f32 with the global
  // TF32 policy).
  void set_precision(PrecisionContext* precision) { precision_ = precision; }

  int64_t step() const { return step_; }
  void set_step(int64_t step) { step_ = step; }
  int64_t steps_per_epoch() const;
  // Steps between metrics records: options.log_every, or steps per epoch / 50 (at least 1).
  int64_t log_every() const;
  // Steps between evaluations besides each epoch's end (0: none): options.eval_every_steps,
  // or a quarter of a run shorter than 4 epochs, so its test curve has points (not for
  // --max-steps runs, which are smoke tests).
  int64_t eval_every() const;

 private:
  double current_lr() const;

  const TrainOptions& options_;
  nn::Module& model_;
  nn::Module& trained_;
  optim::Optimizer& optimizer_;
  optim::LRScheduler* schedule_;
  dist::ProcessGroup& group_;
  Device device_;
  data::DataLoader* train_loader_ = nullptr;
  data::DataLoader* test_loader_ = nullptr;
  dist::Checkpoint* checkpoint_ = nullptr;
  MetricsLog* metrics_ = nullptr;
  PrecisionContext* precision_ = nullptr;
  Progress* progress_ = nullptr;
  int64_t step_ = 0;
  EvalResult last_eval_;
  std::chrono::steady_clock::time_point run_start_ = std::chrono::steady_clock::now();
};

}  // namespace ember::apps

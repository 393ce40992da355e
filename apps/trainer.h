// ember-train's training loop, in the shape of PyTorch's fault-tolerance tutorial Trainer:
// run_batch (one optimizer step), run_epoch, save_snapshot, load_snapshot and train, each
// usable alone. Installed API (<ember/apps/trainer.h>, also in <ember/ember.h>; library
// Ember::apps, part of Ember::ember): README.md's "Training loops with the Trainer" shows a
// program of your own on it. A step's loss is cross_entropy(forward(batch.data), batch.target)
// with integer class targets (logits [N, C, ...], or a GPT's [B, T, V] with
// options.model == "gpt").
//
// Snapshots (dist::Checkpoint files in options.checkpoint_dir) hold the model, optimizer,
// schedule, RNG states, the sampler's epoch and position, the step counter and the epoch's
// running metric sums, so a run resumed from one continues exactly: its final parameters equal
// the uninterrupted run's bit for bit (CPU, --deterministic). They are taken between optimizer
// steps, where no gradient is accumulated, so gradient accumulation restarts at its first
// micro-batch as it would have. Names: checkpoint-epoch-N.safetensors after N whole epochs,
// checkpoint-step-S.safetensors mid-epoch after optimizer step S.
//
// With a dist::ZeroRedundancyOptimizer (ember-train --zero 1|2) a snapshot is a sharded one
// instead (dist/sharded_checkpoint.h), a folder of the same name without the extension: each
// rank writes its shard (its even share of the parameters, its own parameters' optimizer
// state; rank 0 the buffers), nothing gathered, and the rest (schedule, sampler, every rank's
// random state, step, sums) beside them in snapshot.safetensors, a dist::Checkpoint file
// without model or optimizer, written last. Either kind loads with or without ZeRO on any
// number of ranks: under ZeRO a rank reads its own parameters' optimizer state alone, a plain
// optimizer reads all of it.
//
// Changing the number of ranks: a snapshot holds the sampler's position in global terms (the
// samples of the epoch consumed, dist::DistributedSampler::state), the world size and global
// batch it was taken with, and the model's name. Loaded on another number of ranks, the rest of
// the epoch is split among the new ranks (each sample once). With the same global batch
// (ember-train --global-batch-size) the step counter and schedule continue unchanged, so the
// run follows the uninterrupted run's recipe. With another global batch, the schedule as built
// for this run (its state when the trainer was made: the lr for the new global batch, laid over
// this run's steps per epoch) is moved to the same point of the run in samples, and the step
// counter keeps counting optimizer steps (refused with max_steps, which counts them). resume()
// says which happened. A snapshot of another model or of data the sampler cannot continue is
// an ember::Error naming why, with --resume auto too (never skipped as damaged).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ember/autograd/profiler.h>
#include <ember/data/dataloader.h>
#include <ember/dist/checkpoint.h>
#include <ember/dist/process_group.h>
#include <ember/nn/module.h>
#include <ember/optim/lr_scheduler.h>
#include <ember/optim/optimizer.h>
#include <ember/tensor/cuda_graph.h>

#include "metrics_log.h"
#include "precision.h"
#include "progress.h"
#include "train_options.h"

namespace ember::apps {

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// What run_batch saw on this rank. The loss and the count of right answers stay on the
// training device (0-d f64 tensors), so a step never waits for the GPU; loss_value() and
// correct_value() read them back (and wait).
struct BatchResult {
  Tensor loss;        // the batch's mean loss (over all its micro-batches)
  Tensor correct;     // samples classified right (argmax of the logits)
  int64_t count = 0;  // samples (images, or a sequence model's tokens)
  double loss_value() const { return loss.item<double>(); }
  double correct_value() const { return correct.item<double>(); }
};

// The optimizer's parameter groups. no_decay_norm_bias: the weights of convolutions and
// linear layers in group 0, and normalisation weights and every bias (the 1-d parameters)
// in group 1 with weight_decay 0, as timm and most ImageNet recipes do; otherwise one group.
std::vector<optim::ParamGroup> parameter_groups(const nn::Module& model, bool no_decay_norm_bias);

// Why --cuda-graphs cannot capture this run's steps, or "" when it can: it needs a CUDA
// device, one process (DDP launches its all-reduces from autograd hooks and waits for them
// on the host) and one micro-batch per step. (The optimizer's own conditions are checked
// once it has warmed up: Optimizer::device_step_refusal.)
std::string cuda_graphs_refusal(const TrainOptions& options, Device device, int world_size);

struct SnapshotFile {
  std::string path;             // a file, or a sharded snapshot's folder
  int64_t step = 0, epoch = 0;  // from the file's header (a folder's snapshot.safetensors)
};
// The snapshots in `dir`, files and sharded folders, newest (highest step) first, by their
// headers. One of a snapshot's name whose header does not read (a folder whose save did not
// finish) is left out, and "load_checkpoint: path: reason" goes to `unreadable` when given.
std::vector<SnapshotFile> list_snapshots(const std::string& dir,
                                         std::vector<std::string>* unreadable = nullptr);

class Trainer {
 public:
  // model: the bare module (its parameters are clipped); trained: what forward runs, the
  // model itself or its DistributedDataParallel wrapper. schedule may be null (a fixed lr);
  // its state now is taken as its start (a resume with another global batch restarts it from
  // there). A model with f64 parameters gets its floating batches in f64.
  // Uses options.accum_steps, grad_clip, label_smoothing, max_steps, log_every,
  // eval_every_steps, checkpoint_dir, checkpoint_interval, save_every_steps, keep, resume,
  // epochs, cuda_graphs and model; the others are ember-train's. `options` is held by
  // reference: it must outlive the trainer.
  Trainer(const TrainOptions& options, nn::Module& model, nn::Module& trained,
          optim::Optimizer& optimizer, optim::LRScheduler* schedule, dist::ProcessGroup& group,
          Device device);

  // One optimizer step on `batch`: options.accum_steps equal micro-batches, each loss scaled
  // by 1 / accum_steps so the gradients are those of the whole batch's mean loss (under DDP
  // the first accum_steps - 1 backward passes run inside no_sync(), so gradients are averaged
  // across ranks once); then the gradients' L2 norm is clipped to options.grad_clip (when
  // > 0), the optimizer steps and the schedule steps.
  //
  // With options.cuda_graphs (where cuda_graphs_refusal allows; else it says why once and
  // runs eagerly): the optimizer is made capturable (lr and Adam's step counts on the
  // device), and after kGraphWarmupSteps eager steps, once the optimizer's step needs nothing
  // from the host (Optimizer::device_step_refusal; up to kGraphMaxWarmupSteps, e.g. while
  // fp16's first steps are skipped before SGD's momentum exists), the whole step is captured
  // in one CUDA graph: forward, loss, backward, clipping, the GradScaler's check, unscale and
  // scale update (fp16), and the optimizer step. Every later batch of that size is copied
  // into the graph's static input and label buffers (staged on the copy stream while the
  // previous replay runs, then one device-to-device copy), the lr scalars are written, and
  // the graph replayed; only the schedule and the step counter run on the host. Gradients
  // live in the graph's memory and each replay rewrites them. A step that cannot be captured
  // prints one message and the run goes on eagerly.
  BatchResult run_batch(const data::Batch& batch);
  static constexpr int64_t kGraphWarmupSteps = 3;
  static constexpr int64_t kGraphMaxWarmupSteps = 50;
  // Whether steps replay a captured CUDA graph now.
  bool replaying_cuda_graph() const { return captured_ != nullptr; }

  // What run_epoch, evaluate, save_snapshot and train use; the trainer does not own them.
  // checkpoint may be null (no snapshots). Attach before load_snapshot (an epoch's length
  // is taken from the train loader here).
  void attach(data::DataLoader& train_loader, data::DataLoader& test_loader,
              dist::Checkpoint* checkpoint, MetricsLog& metrics, Progress& progress);

  // Loss and accuracy on the test loader, summed over every rank's shard.
  EvalResult evaluate();
  // One pass over the training loader: metrics every log_every steps, an evaluation every
  // eval_every_steps, the epoch record at the end. False when max_steps ended the run.
  // NOTE: the running loss and accuracy sums accumulate on the device and are read back
  // only where something prints or saves them (a metrics record, a progress line, an
  // evaluation, a snapshot, the epoch's end), so the GPU runs ahead of the host between
  // them; the sums add in the same order as on the host, so the figures are the same.
  bool run_epoch(int64_t epoch);
  // The state after the last run_batch of `epoch` as a snapshot in checkpoint_dir: the
  // epoch's, or mid-epoch the step's (all ranks take part; sharded under ZeRO). Then rank 0
  // deletes the oldest snapshots, files or folders, beyond options.keep (when > 0).
  void save_snapshot(int64_t epoch);
  // Restores a snapshot, a file or a sharded folder (every rank): returns the epoch to
  // continue, which run_epoch continues from the saved batch when the snapshot was taken
  // mid-epoch. Taken on another number of ranks or global batch: see "Changing the number of
  // ranks" above (resume() says what happened).
  int64_t load_snapshot(const std::string& path);
  // options.resume: "" starts afresh (returns 0); a path loads that file; "auto" loads the
  // newest snapshot that loads (a damaged one is skipped with a warning on stderr naming it
  // and why), or starts afresh when there is none. Returns the epoch to continue; the ranks
  // must all find the same snapshot (a folder every node sees).
  int64_t resume();
  // Epochs first_epoch .. options.epochs - 1 (or until max_steps), snapshots as asked:
  // every checkpoint_interval epochs and at the end, and every save_every_steps steps.
  // Returns the last evaluation (one is made when no epoch is left to run).
  // With options.trace: steps trace_start .. trace_end - 1 are traced (ember::profiler) on
  // every rank, and when they end (or the run does) rank 0 writes the merged trace to
  // options.trace and prints the overlap figures (apps/trace_report.h).
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
  // The epoch so far on this rank (a resumed epoch's sums start from the snapshot's).
  struct EpochSums {
    double loss_sum = 0, correct = 0, seen = 0;
    int64_t batches = 0;       // of the epoch, those before a resume included
    int64_t pass_batches = 0;  // of this pass over the loader
    int64_t seen_images = 0;   // of this pass, over all ranks
  };
  double current_lr() const;
  int64_t global_batch() const;  // the train loader's batch x world size
  // ember::Error when the snapshot at `path` (its header `metadata`) cannot be continued by
  // this run: another model, or a sampler state this run's sampler refuses.
  void check_continuable(const std::string& path,
                         const std::map<std::string, std::string>& metadata) const;
  // After loading a snapshot of global batch `saved_global` on `saved_world` ranks: the
  // schedule moved (another global batch) and resize_note_ written.
  void follow_resize(int64_t saved_world, int64_t saved_global, int64_t first_epoch,
                     uint64_t sampler_epoch);
  // One micro-batch's forward, loss (scaled by `scale`) and backward; its loss and right
  // answers added to `result` on the device.
  // A GPT's logits [B, T, V] against targets [B, T] count per token ([B * T, V]); other
  // models' logits keep their classes in dim 1, as cross_entropy reads them.
  void forward_backward(const Tensor& x, const Tensor& target, double scale, BatchResult& result);
  // After the gradients: clipping and the optimizer step (through the scaler in fp16), all on
  // the device (what a captured step holds).
  void update_parameters();
  // After an update: the schedule's step and the step counter (host work, never captured).
  void advance();
  // A batch tensor (pinned on CUDA runs) on the training device, copied without waiting.
  Tensor to_device(const Tensor& t);
  // Floating input in the dtype of the model's parameters (f64 for a model.to(kF64)).
  Tensor model_input(const Tensor& x) const;
  // --cuda-graphs: whether this batch runs through the graph (deciding once whether graphs
  // are allowed), and the capture of a step (false, after saying why, when it failed).
  bool use_cuda_graph(const data::Batch& batch);
  bool capture_step(const data::Batch& batch);
  // Turns graphs off for the run, saying why once (rank 0).
  void cuda_graphs_off(const std::string& why);
  bool snapshots() const { return checkpoint_ != nullptr && !options_.checkpoint_dir.empty(); }
  void delete_old_snapshots() const;
  // load_snapshot of a sharded snapshot's folder: the model's tensors straight into the
  // model's, the optimizer state (under --zero this rank's own parameters' alone), then the
  // rest into checkpoint_'s members.
  void load_sharded_snapshot(const std::string& dir);
  // After a step of run_epoch: adds r to the device sums; the metrics record and evaluation
  // that are due.
  void record_step(const BatchResult& r, double lr, bool last);
  // The device sums into sums_, window_.loss and last_loss_ (one read, which waits).
  void read_back();
  // The epoch's end: evaluation, the epoch record and its line.
  void finish_epoch(int64_t epoch, double images_per_s, double epoch_seconds);
  // The model's forward: through DDP's (which calls the model as a trace's root module) or
  // the model called as a module.
  Tensor call_model(const Tensor& x);
  // Where a trace times the step's regions: the training device, but no device while a CUDA
  // graph captures (its events would be captured too, and their host clock cannot be read).
  Device traced_device() const { return capturing_ ? Device() : device_; }
  // --trace: the profiler over the window's steps, and the merged trace at its end.
  void start_trace();
  void write_trace(const profiler::Profiler& profiler);

  const TrainOptions& options_;
  nn::Module& model_;
  nn::Module& trained_;
  optim::Optimizer& optimizer_;
  optim::LRScheduler* schedule_;
  dist::ProcessGroup& group_;
  Device device_;
  DType input_dtype_ = kF32;  // the model's first floating parameter's
  data::DataLoader* train_loader_ = nullptr;
  data::DataLoader* test_loader_ = nullptr;
  dist::Checkpoint* checkpoint_ = nullptr;
  MetricsLog* metrics_ = nullptr;
  PrecisionContext* precision_ = nullptr;
  Progress* progress_ = nullptr;
  int64_t step_ = 0, steps_per_epoch_ = 0;
  optim::StateDict initial_schedule_;  // the schedule as built (follow_resize restarts it)
  // After a load_snapshot of another world size or global batch: what changed and how the
  // schedule follows ("" otherwise); resume() prints it.
  std::string resize_note_;
  EpochSums sums_;
  // The last sharded snapshot loaded: the CPU bytes this rank allocated reading its model and
  // optimizer state, and the whole optimizer state's bytes (resume() reports the largest).
  struct ShardedLoad {
    uint64_t peak_bytes = 0, optimizer_bytes = 0;
  } sharded_load_;
  struct Window {  // the steps since the last metrics record
    double loss = 0;
    int64_t images = 0, steps = 0;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  } window_;
  // On the training device, 0-d f64: the epoch's loss * count and right answers, and the
  // window's loss (each the host sum it mirrors, continued), and the last step's loss.
  struct DeviceSums {
    Tensor loss_sum, correct, window_loss, last_loss;
  } device_sums_;
  double last_loss_ = 0;                     // the last step's loss, as of the last read_back
  std::optional<cuda::Stream> copy_stream_;  // CUDA: where batches are copied to the device
  // --cuda-graphs: the captured step, its static buffers and results.
  struct CapturedStep {
    cuda::CUDAGraph graph;
    Tensor x, y, loss, correct;
  };
  std::unique_ptr<CapturedStep> captured_;
  enum class Graphs { kUndecided, kOff, kOn } graphs_ = Graphs::kUndecided;
  int64_t graph_warmup_ = 0;  // eager steps run since graphs were allowed
  bool capturing_ = false;    // a step is being captured
  EvalResult last_eval_;
  std::unique_ptr<profiler::Profiler> profiler_;  // --trace
  bool trace_written_ = false;
  std::chrono::steady_clock::time_point run_start_ = std::chrono::steady_clock::now();
};

}  // namespace ember::apps

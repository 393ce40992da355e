// ember-train's command line: what to train, on what, and how.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ember/optim/param_groups.h>

namespace ember::apps {

struct TrainOptions {
  std::string data = "data";        // cifar-10-batches-bin/, cifar-100-binary/ or train/ + val/
  std::string dataset = "auto";     // auto | cifar10 | cifar100 | fashion-mnist | mnist | folder
  int64_t image_size = 64;          // --dataset folder: shorter side resized, then cropped square
  std::vector<double> mean, std;    // --dataset folder: normalisation; empty: measured on train
  std::string bad_images = "fail";  // --dataset folder: fail | skip (named, counted)
  std::string model = "resnet20";
  int64_t epochs = 10;
  int64_t batch_size = 128;  // per rank
  // --global-batch-size: over all ranks (each takes it / world size); 0: batch_size per rank.
  int64_t global_batch_size = 0;
  std::string optimizer = "sgd";  // sgd | adamw
  double lr = 0.1;                // for a global batch of 128; scaled linearly
  double momentum = 0.9;
  double weight_decay = 5e-4;
  std::string schedule = "onecycle";  // onecycle | cosine | step | constant
  double warmup_epochs = -1;          // < 0: the schedule's default (see schedule.h)
  int64_t warmup_steps = -1;          // < 0: from warmup_epochs; wins over it when set
  // 0: F.cross_entropy's, for a Trainer of one's own; ember-train's ResNet recipe takes 0.1
  // where --label-smoothing is not given (parse_train_options).
  double label_smoothing = 0.0;
  std::string device = "auto";     // auto | cpu | cuda
  std::string precision = "auto";  // auto | fp32 | tf32 | bf16 | fp16 (see precision.h)
  // --dtype: the model's parameters and the batches, f32 or f64 (as model.double(); with
  // --precision fp32 only, for checks to f64 rounding).
  std::string dtype = "f32";
  int threads = 0;  // 0: see threads_to_set
  int workers = 2;
  uint64_t seed = 0;  // a fixed default, as PyTorch scripts have: runs repeat unless changed
  bool deterministic = false;
  std::string checkpoint_dir;       // empty: no snapshots (--out-dir when asked for by the next)
  int64_t checkpoint_interval = 1;  // epochs
  int64_t save_every_steps = 0;     // also a snapshot every this many steps; 0: per epoch only
  int64_t keep = 0;                 // snapshots kept (the newest); 0: all
  std::string resume;               // "": start afresh; "auto": the newest valid snapshot; a file
  bool sync_bn = false;
  std::string compression = "none";  // none | fp16 | bf16
  int64_t max_steps = 0;             // stop after this many steps (smoke runs); 0: no limit
  std::string out_dir = "runs";      // metrics.jsonl and curves.png
  int64_t log_interval = 50;         // steps between log lines when not on a terminal
  int64_t log_every = 0;             // steps between metrics records; 0: steps per epoch / 50
  int64_t eval_every_steps = 0;      // 0: each epoch, and 4 times in runs under 4 epochs
  int64_t accum_steps = 1;           // micro-batches per batch (gradient accumulation)
  double grad_clip = 0;              // max gradient norm; 0: no clipping
  bool no_decay_norm_bias = false;   // no weight decay on 1-d parameters (norms, biases)
  // --zero: 1 wraps the optimizer in dist::ZeroRedundancyOptimizer, 2 also shards DDP's
  // gradients (see dist/zero.h); 0: neither.
  int zero = 0;
  // --channels-last / --no-channels-last: the model's conv weights (and so its activations)
  // in channels_last; -1 (neither given): on for CUDA, where cuDNN's NHWC kernels use the
  // tensor cores, off on the CPU.
  int channels_last = -1;
  // --cuda-graphs: after warm-up steps, one training step's forward and backward are captured
  // in a CUDA graph and replayed (see Trainer); one process on CUDA only.
  bool cuda_graphs = false;
  // --trace FILE: Chrome Trace Event JSON of steps [trace_start, trace_end) of every rank,
  // merged by rank 0 (see README.md's "Reading a trace"); "": no trace.
  std::string trace;
  int64_t trace_start = 10, trace_end = 20;
  // --model gpt (apps/gpt_setup.h): the transformer's shape and its text. --data names a text
  // file, a folder of them, or "fortunes"; an epoch draws windows_per_epoch random windows
  // (0: as many as hold the training tokens once).
  int64_t n_layer = 6, n_head = 6, n_embd = 384, block_size = 256;
  double dropout = 0.1;
  std::string tokens = "char";  // char | byte
  int64_t windows_per_epoch = 0;
  int64_t eval_windows = 512;  // validation windows per evaluation (the same ones each time)
  // Which parameters take weight decay: nanogpt | mingpt (optim::WeightDecayRule).
  std::string decay_rule = "nanogpt";
};

// `ember-train sample`: text from a GPT snapshot.
struct SampleOptions {
  std::string checkpoint;  // a snapshot of an ember-train --model gpt run
  std::string prompt;      // "" starts from a newline
  int64_t tokens = 200;    // new tokens per sample
  int64_t samples = 1;
  double temperature = 0.8;  // 0: always the most likely token
  int64_t top_k = 0;         // 0: every token may be drawn
  uint64_t seed = 0;
  std::string device = "auto";
};

inline bool is_gpt(const TrainOptions& options) { return options.model == "gpt"; }

// --model gpt's weight-decay rule, --decay-rule (see <ember/optim/param_groups.h>).
inline optim::WeightDecayRule weight_decay_rule(const TrainOptions& options) {
  return options.decay_rule == "mingpt" ? optim::WeightDecayRule::kMinGPT
                                        : optim::WeightDecayRule::kNanoGPT;
}

// Whether the model trains in channels_last on a device that is (or is not) CUDA.
inline bool use_channels_last(const TrainOptions& options, bool cuda) {
  return options.channels_last < 0 ? cuda : options.channels_last == 1;
}

// Images per rank and step on `world_size` ranks: --batch-size, or --global-batch-size /
// world_size, an ember::Error saying so when that does not divide (or not into --accum-steps
// micro-batches).
int64_t per_rank_batch(const TrainOptions& options, int world_size);

// The CPU thread count to set for --threads `threads`: itself when positive. For 0, this
// process's share of its CPUs (cpu_share) among the processes a launcher started on this node
// (LOCAL_WORLD_SIZE from ember-run, torchrun or dist::spawn; OMPI_COMM_WORLD_LOCAL_SIZE from
// Open MPI's mpirun; MPI_LOCALNRANKS from MPICH's), so ranks do not oversubscribe the cores;
// but 0 (leave OpenMP's count: OMP_NUM_THREADS, else all cores) when OMP_NUM_THREADS is set
// or no launcher is seen.
int threads_to_set(int threads);

// Parses argv; prints help or a clear message and returns the exit code to leave with when
// the program should not run (0 for --help), or -1 to go on. `sample` as the first argument
// fills `sample` instead and sets *sampling. With --model gpt, the options a user did not
// give take the GPT recipe's defaults (nanoGPT's: AdamW lr 6e-4, betas (0.9, 0.95), weight
// decay 0.1 on every parameter of 2 or more dims, the embeddings included (--decay-rule
// mingpt: not on the embeddings either), warmup-cosine, gradient clip 1, no label smoothing,
// batch 64, the fortunes corpus).
int parse_train_options(int argc, char** argv, TrainOptions& options,
                        SampleOptions* sample = nullptr, bool* sampling = nullptr);

}  // namespace ember::apps

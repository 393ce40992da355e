// Training checkpoints: everything a run needs to continue exactly where it stopped.
//
// The file is a safetensors file (8-byte little-endian header length, a JSON header giving
// each tensor's dtype, shape and data_offsets, then the raw little-endian data), so Python's
// safetensors opens it. Tensors: "model.<name>" (parameters and buffers) and
// "optimizer.<key>" (optimizer state buffers). Everything else lives in "__metadata__" as
// strings: optimizer and scheduler scalars, epoch, step, RNG states (seed and offset per
// named generator), the sampler's epoch and position, and a checksum of the data.
//
// save_checkpoint writes on rank 0 only (to a temporary file NAME.tmp.PID in the same folder,
// locked while it is written, then fsync, rename, fsync of the folder: a crash leaves the
// previous checkpoint whole), then all ranks meet at a barrier. Temporary files in that folder
// that no writer holds any more (left by one that died mid-save) are removed at the next save
// (where the file system has no flock, they stay).
// load_checkpoint runs on every rank and validates the file before changing anything it can
// (header, offsets, sizes, dtypes, checksum, names and shapes against the model): a problem is an
// ember::Error naming the file and what is wrong. Only rank 0's RNG states are saved; ranks seeding
// their generators differently should reseed after loading.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include <ember/nn/module.h>
#include <ember/optim/grad_scaler.h>
#include <ember/optim/lr_scheduler.h>
#include <ember/optim/optimizer.h>
#include <ember/tensor/random.h>

#include "distributed_sampler.h"
#include "process_group.h"

namespace ember::dist {

// What a checkpoint covers; null members are left out (on save) or not restored (on load).
struct Checkpoint {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;
  optim::LRScheduler* scheduler = nullptr;
  std::map<std::string, Generator*> generators{};  // e.g. {{"default", &default_generator()}}
  DistributedSampler* sampler = nullptr;
  // fp16 loss scaling: saved when set (and enabled); loaded when the file holds a scaler's
  // state, else left as it is (a checkpoint of an fp32 or bf16 run loads into an fp16 one).
  optim::GradScaler* grad_scaler = nullptr;
  // Saved: the sampler's position() plus this many samples of its current indices() already
  // consumed. Loading restores the sampler's epoch and position and resets this to 0.
  int64_t sampler_consumed = 0;
  int64_t epoch = 0;
  int64_t step = 0;
  // The caller's own numbers (e.g. running sums of a metric), saved exactly; loading
  // replaces them with the file's.
  std::map<std::string, double> values{};
  // The caller's own strings (a model's configuration, a tokenizer's vocabulary), saved as
  // UTF-8 in the header; loading replaces them with the file's.
  std::map<std::string, std::string> texts{};
};

// Rank 0 writes `path` atomically; then every rank waits at a barrier of `group` (when given).
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     ProcessGroup* group = nullptr);

// Restores every non-null member of `checkpoint` (and epoch, step) from `path`. Tensors are
// read onto `device` (the map location), then copied into the model's and optimizer's own
// tensors wherever those live.
void load_checkpoint(const std::string& path, Checkpoint& checkpoint, Device device = kCPU);

// The raw contents of a checkpoint file, validated: tensors (on `device`) and metadata.
struct CheckpointFile {
  std::map<std::string, Tensor> tensors{};
  std::map<std::string, std::string> metadata{};
};
CheckpointFile read_checkpoint(const std::string& path, Device device = kCPU);

// The metadata alone (epoch, step, ...), from the header: cheap for choosing among many
// files. Throws like read_checkpoint when the header is damaged; the data is not checked.
std::map<std::string, std::string> read_checkpoint_metadata(const std::string& path);

}  // namespace ember::dist

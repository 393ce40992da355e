// Training checkpoints: everything a run needs to continue exactly where it stopped.
//
// The file is a safetensors file (8-byte little-endian header length, a JSON header giving
// each tensor's dtype, shape and data_offsets, then the raw little-endian data), so Python's
// safetensors opens it. Tensors: "model.<name>" (parameters and buffers) and
// "optimizer.<key>" (optimizer state buffers). Everything else lives in "__metadata__" as
// strings: optimizer and scheduler scalars, epoch, step, RNG states (seed and offset per
// named generator, for each rank of a grouped save), the sampler's epoch and position, and a
// checksum of the data. (State split across ranks, as ZeRO's, is saved one file per rank
// instead: sharded_checkpoint.h. Both read and write the format through detail/safetensors.h.)
//
// Saving, in two forms:
//   save_checkpoint(path, ck)         not collective, like torch.save: rank 0 of the default
//                                     group writes and every other rank returns at once
//                                     without writing (with no default group, as in a single
//                                     process, the caller writes). So the tutorial's
//                                     `if (rank == 0) save_checkpoint(path, ck);` works as
//                                     written, and a call on every rank writes once. The file
//                                     holds rank 0's random states only.
//   save_checkpoint(path, ck, group)  collective: every rank of `group` calls it. The ranks
//                                     gather every rank's generator states to rank 0, rank 0
//                                     writes, and every rank returns once the file is written
//                                     (or fails with rank 0's failure). Not for
//                                     `if (rank == 0)`: called on some ranks only, it fails
//                                     at once on every rank when the others issue their next
//                                     collective, each naming the other's call, or when they
//                                     leave the group (destroy_process_group, exit), naming
//                                     who left after which collective (MPI and TCP; NCCL in
//                                     debug mode, EMBER_DIST_DEBUG=1, else at the timeout).
// Rank 0 writes to a temporary file NAME.tmp.PID in the same folder, locked while it is
// written, then fsync, rename, fsync of the folder: a crash leaves the previous checkpoint
// whole. Temporary files in that folder that no writer holds any more (left by one that died
// mid-save) are removed at the next save (where the file system has no flock, they stay).
//
// load_checkpoint runs on every rank and validates the file before changing anything it can
// (header, offsets, sizes, dtypes, checksum, names and shapes against the model): a problem is an
// ember::Error naming the file and what is wrong. It communicates nothing.
//
// Random states: rank r of the loading group (`group`, else the default group, else a single
// process: rank 0 of 1) takes the states rank r saved. A file from a grouped save over N ranks
// holds N ranks' states (a single process's or save_checkpoint(path, ck)'s: N = 1, rank 0's).
// Loaded on M ranks: ranks below N take their own; ranks N and up, which the saving run did
// not have, start afresh from a state derived from the seed (rank 0's seed + the rank, offset
// 0), distinct for each rank; rank 0 prints a warning naming both counts when M != N. A file
// from ember before per-rank states (no "rng_ranks") holds rank 0's alone, and every loading
// rank takes those. Keys: "rng.NAME.seed" / ".offset" (rank 0's, as in every ember
// checkpoint), "rng_rank.R.NAME.seed" / ".offset" (rank R >= 1's) and "rng_ranks" (N).
//
// The sampler's position is saved in global terms (DistributedSampler::state: the epoch and
// the samples of its global order consumed), so a file loads on any number of ranks: the rest
// of the epoch is split among the loading ranks; a sampler that cannot continue it (another
// dataset size, order or seed) is refused, naming why.
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
  // e.g. {{"default", &default_generator()}}; every rank names the same generators.
  std::map<std::string, Generator*> generators{};
  DistributedSampler* sampler = nullptr;
  // fp16 loss scaling: saved when set (and enabled); loaded when the file holds a scaler's
  // state, else left as it is (a checkpoint of an fp32 or bf16 run loads into an fp16 one).
  optim::GradScaler* grad_scaler = nullptr;
  // Saved: the sampler's state(sampler_consumed), i.e. its position plus this many samples of
  // its current indices() already consumed, in global terms. Loading continues that state on
  // this group's ranks (DistributedSampler::load_state) and resets this to 0.
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

// Writes `path` atomically. Without a group (null): not collective, rank 0 of the default
// group writes, the others return at once. With a group: collective over it, every rank's
// random states saved (see above).
void save_checkpoint(const std::string& path, const Checkpoint& checkpoint,
                     ProcessGroup* group = nullptr);

// Restores every non-null member of `checkpoint` (and epoch, step) from `path`. Tensors are
// read onto `device` (the map location), then copied into the model's and optimizer's own
// tensors wherever those live. The generators take the states of this rank of `group` (null:
// of the default group, or rank 0 with none), as described above.
void load_checkpoint(const std::string& path, Checkpoint& checkpoint, Device device = kCPU,
                     const ProcessGroup* group = nullptr);

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

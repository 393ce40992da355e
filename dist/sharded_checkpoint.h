// Sharded snapshots: every rank writes its own part of the state in parallel, and any number
// of ranks reads it back, each reading only the bytes it asks for, so no rank ever holds the
// whole state (PyTorch's distributed checkpoint, for ZeRO-sharded optimizer state and for
// runs that resume on another number of ranks).
//
// A snapshot is a folder:
//   shard-R-of-W-ID.safetensors  rank R's shard of save ID (16 hex digits), one per rank
//   index.json                   written by rank 0 once every shard exists
// A shard is a plain safetensors file (Python's safetensors opens it alone): each tensor the
// rank holds part of, as that part's flat (row-major) elements under the tensor's name, 1-D.
// Its "__metadata__" holds "format" ("ember.shard.v1"), "checksum", "ember.save" (ID),
// "ember.rank", "ember.world_size", per tensor "ember.shape.NAME" (the full shape, JSON),
// "ember.begin.NAME" (the first flat element held) and "ember.checksum.NAME", and the
// caller's own metadata. The index (JSON) names everything a reader needs:
//   {"format": "ember.sharded.v1", "save": ID, "world_size": W, "shards": [file by rank],
//    "metadata": {key: string}, "tensors": {NAME: {"dtype": "F32", "shape": [6, 4],
//    "pieces": [{"shard": R, "begin": B, "end": E}, ...]}}}
// where the pieces, in order, cover the tensor's flat elements [0, numel) exactly once.
//
// The snapshot is replaced whole: new shards carry a new ID, the index is renamed over the old
// one only after every shard exists, and the old shards are removed after that. A crash leaves
// the previous snapshot readable (with a new save's orphaned shards, removed by the next save).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include <ember/nn/module.h>
#include <ember/optim/optimizer.h>

#include "process_group.h"

namespace ember::dist {

// The part of a tensor split across ranks that this rank holds: `values` (any shape; read in
// row-major order) are elements [begin, begin + values.numel()) of the full tensor's flat
// elements.
struct TensorShard {
  Shape shape;  // the full tensor's
  int64_t begin = 0;
  Tensor values;
};

// What one rank saves.
struct ShardedState {
  // Tensors every rank holds whole (parameters and buffers, a DDP run's optimizer state):
  // rank r writes only its even_split() share of each.
  std::map<std::string, Tensor> replicated{};
  // Tensors the caller splits across ranks (a ZeRO rank's optimizer state, whole parameters'
  // state or flat ranges): this rank's part of each; a rank holding none of a tensor leaves it
  // out. Every element must be held by exactly one rank, in one dtype.
  std::map<std::string, TensorShard> sharded{};
  // Strings for the index: the union over the ranks (a key given on several ranks must have
  // one value). Keys "format", "checksum" and "ember.*" are reserved.
  std::map<std::string, std::string> metadata{};
};

// Adds an optimizer state dict (optim::Optimizer::state_dict()'s format), or the part of one
// this rank holds, under `prefix`: its tensors as sharded tensors this rank holds whole, its
// scalars as metadata (exact decimal). For a ZeRO rank: the state of the parameters it owns,
// keyed by their index in the whole optimizer, and the groups' options (alike on every rank).
// A key already in `state` is an ember::Error naming it.
void add_state_dict(ShardedState& state, const optim::StateDict& dict,
                    const std::string& prefix = "optimizer.");

// Elements [first, second) of `numel` that rank `rank` of `world_size` holds when a tensor is
// split evenly (sizes differ by one at most, the larger first).
std::pair<int64_t, int64_t> even_split(int64_t numel, int64_t rank, int64_t world_size);

// Writes the folder `dir` (created if needed) as described above. Collective over `group`:
// every rank writes its shard at once, then rank 0 checks that the shards fit together
// (shapes, dtypes, every element held once, metadata agreeing), writes the index, and every
// rank returns once it is written. A failure on any rank throws on every rank, naming it.
void save_sharded_checkpoint(const std::string& dir, const ShardedState& state,
                             ProcessGroup& group);

// A sharded snapshot opened for reading. Not collective: each rank opens it and reads what it
// needs. The index is read and checked at once (bounded, every shard named is a plain file in
// the folder and exists, the pieces cover each tensor exactly); a shard's header is read and
// checked against the index when first needed. Every error is an ember::Error starting
// "load_sharded_checkpoint: FILE: " and naming the field.
//
// Memory: a read allocates what it returns and nothing more from ember's allocators (the bytes
// pass through one buffer of at most 1 MiB); read_into() into a contiguous CPU tensor of the
// saved dtype allocates nothing, into any other tensor one temporary of its size. So a rank
// taking its even share on at least as many ranks as saved the snapshot allocates at most the
// largest shard plus one parameter, and nothing is ever gathered whole on one rank. Each piece
// read is checked whole against its checksum, so a rank wanting part of a piece reads all of
// that piece's bytes (through the buffer).
class ShardedCheckpoint {
 public:
  struct TensorInfo {
    DType dtype = kF32;
    Shape shape;
  };

  explicit ShardedCheckpoint(const std::string& dir);
  ~ShardedCheckpoint();
  ShardedCheckpoint(const ShardedCheckpoint&) = delete;
  ShardedCheckpoint& operator=(const ShardedCheckpoint&) = delete;

  // The number of ranks that saved it.
  int64_t world_size() const;
  const std::map<std::string, std::string>& metadata() const;
  // Every tensor's dtype and full shape, by name.
  const std::map<std::string, TensorInfo>& tensors() const;

  // Elements [begin, end) of tensor `name`'s flat elements: a 1-D CPU tensor in the saved
  // dtype.
  Tensor read(const std::string& name, int64_t begin, int64_t end) const;
  // The whole tensor, in its full shape, on the CPU.
  Tensor read(const std::string& name) const;
  // Fills `out` (any device, dtype and layout) with elements [begin, begin + out.numel()) of
  // `name`, in row-major order, converted as copy_ converts.
  void read_into(const std::string& name, int64_t begin, Tensor out) const;
  // A state dict saved by add_state_dict under `prefix`: every scalar, and each tensor whose
  // key (without the prefix) `wanted` accepts (every one without `wanted`), read whole: a ZeRO
  // rank of any world size asks for its own parameters' state alone.
  optim::StateDict read_state_dict(
      const std::string& prefix = "optimizer.",
      const std::function<bool(const std::string& key)>& wanted = nullptr) const;
  // Loads the module's parameters and buffers from tensors `prefix` + their names, strictly
  // (missing, unexpected or differently shaped tensors: an error naming them, before anything
  // changes), reading each straight into the module's own tensor. A shard found damaged midway
  // leaves the module partly loaded.
  void load_module(nn::Module& module, const std::string& prefix = "model.") const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::dist

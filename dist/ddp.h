// DistributedDataParallel: data-parallel training of one model replica per rank
// (torch.nn.parallel.DistributedDataParallel's model).
//
//   dist::init_process_group();
//   auto ddp = std::make_shared<dist::DistributedDataParallel>(model);  // the default group
//   optim::SGD sgd(ddp->parameters(), {.lr = 0.1});
//   Tensor loss = cross_entropy((*ddp)(x), y);
//   loss.backward();   // gradients averaged across ranks by the time backward returns
//   sgd.step();
//
// At construction every rank checks that all ranks hold the same parameters (names,
// shapes, dtypes) and takes rank 0's parameter and buffer values. Gradients live in flat
// per-dtype buckets (parameters in reverse registration order, the first bucket capped at
// 1 MiB, the others at 25 MiB): each parameter's grad() is a view into its bucket, so
// backward accumulates straight into communication memory. When the last gradient of a
// bucket is accumulated (a post-accumulate-grad hook), that bucket's average all-reduce is
// issued asynchronously, so communication overlaps the rest of backward; buckets are issued
// in index order on every rank. When the last bucket is issued the hook waits for all of
// them, so gradients are averaged when backward returns; synchronize() does the same wait
// explicitly (and reports parameters whose gradient never arrived). After the first
// iteration the buckets are rebuilt once, from the order gradients actually became ready
// (rank 0's order, broadcast).
//
// While a trace records (ember::profiler, ember-train --trace), each bucket's all-reduce is
// timed with its bytes on the trace's "DDP all-reduce" row, and the wait for the last buckets
// as "DDP wait for all-reduce".
//
// Uneven inputs (ranks with different numbers of batches): train inside a dist::Join
// (join.h), which makes ranks that ran out shadow the others' collectives.
//
// ZeRO-2 (reduce_to_owners, which dist::ZeroRedundancyOptimizer::shard_gradients calls; see
// zero.h): each parameter's gradient belongs to one rank, the rank whose optimizer shard
// holds it. Each bucket lays its parameters out owner by owner and is reduced (averaged) to
// each owner by one reduce per owner with a segment there instead of one all-reduce; once a
// bucket's reductions are done (checked as later buckets are issued, on NCCL at the end of
// backward), the rank keeps its own gradients in a compact copy, drops the others' (grad()
// undefined) and releases the bucket, which is allocated again only when a gradient arrives
// in it. Not under a Join (ember::Error).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ember/nn/module.h>

#include "process_group.h"

namespace ember::dist {

class Join;
namespace detail {
class JoinChannel;
}

struct DDPOptions {
  size_t bucket_cap_bytes = size_t{25} << 20;
  size_t first_bucket_cap_bytes = size_t{1} << 20;
  // Parameters that take no part in a forward are found by walking the output's graph and
  // marked ready at once (their gradient: whatever the bucket holds, zero after zero_grad).
  // Off: a parameter whose gradient never arrives is an error at synchronize() or at the
  // next forward, naming it.
  bool find_unused_parameters = false;
  // Every forward first copies rank 0's buffers (BatchNorm running statistics) to all ranks,
  // packed into one broadcast per dtype and device.
  bool broadcast_buffers = true;
  // The largest piece those broadcasts (and the one of parameters at construction) send at a
  // time, and so the extra memory they take (PyTorch's broadcast_bucket_size); a tensor
  // larger than this travels alone.
  size_t broadcast_bucket_bytes = size_t{256} << 20;
  // kBF16 or kF16: buckets travel in this dtype (divided by the world size first, so the
  // sum cannot overflow) and are cast back. Unset: full precision.
  std::optional<DType> compression{};
  // Rebuild the buckets once after the first iteration from the observed gradient order.
  bool rebuild_buckets = true;
};

class DistributedDataParallel : public nn::Module {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module, std::shared_ptr<ProcessGroup> group,
                          DDPOptions options = {});
  // Over the default group (init_process_group()), as PyTorch's DDP(model) does; ember::Error
  // before init_process_group().
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module, DDPOptions options = {});
  ~DistributedDataParallel() override;

  // Broadcasts buffers (when asked), points gradients into the buckets and, unless inside
  // no_sync(), arms the hooks for the coming backward; then runs the wrapped module's
  // forward (one input and output) or forward_list (several: (*ddp)(image, mask)).
  Tensor forward(const Tensor& input) override;
  nn::TensorList forward_list(const nn::TensorList& inputs) override;
  std::string name() const override { return "DistributedDataParallel"; }

  // Waits until every bucket's all-reduce finished and the averaged gradients are in
  // place (on NCCL: orders the current CUDA stream after them, see process_group.h).
  // Called automatically by the last hook of backward; harmless to call again.
  // ember::Error naming the parameters still missing a gradient if backward did not reach
  // them (and find_unused_parameters is off).
  void synchronize();

  // While a guard lives, forward/backward accumulate gradients locally without
  // communication; the first synced backward after it averages the accumulated sum.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp);
    ~NoSyncGuard();
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  ProcessGroup& group() { return *group_; }
  const DDPOptions& options() const { return options_; }

  // ZeRO-2 from now on: `owner_of` gives the rank (of this DDP's group) owning each parameter's
  // gradient; the buckets are rebuilt around it. Every rank calls it, between iterations, with
  // the same owners. ember::Error while a backward is pending or under a Join.
  void reduce_to_owners(const std::function<int(const Tensor&)>& owner_of);
  // Whether reduce_to_owners was called.
  bool reduces_to_owners() const;

  // The parameter names of each bucket, in bucket order (for inspection and tests).
  std::vector<std::vector<std::string>> bucket_parameter_names() const;
  bool buckets_rebuilt() const;

  struct Reducer;  // the bucket state the autograd hooks share

 private:
  friend class Join;
  // Join's hooks: enlists (or, with null, releases) this DDP as `index` of a Join; on a
  // joined rank, rebuilds the buckets as the active ranks do; when every rank has joined,
  // copies rank `root`'s parameters and buffers everywhere.
  void set_join(std::shared_ptr<detail::JoinChannel> channel, int index);
  void join_rebuild_buckets();
  // On a joined rank: takes part in the all-reduce of bucket `bucket` (`numel` elements) with
  // zeros, keeping the result in the bucket's gradients.
  void join_shadow_bucket(size_t bucket, int64_t numel, ReduceOp op);
  void join_sync_final_model(int root);

  // Readies the buckets for the coming backward; true when this forward's backward syncs.
  bool prepare_forward();
  // With find_unused_parameters: marks ready the parameters no output's graph reaches.
  void mark_unreached_parameters(const nn::TensorList& outputs);

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<ProcessGroup> group_;
  DDPOptions options_;
  std::shared_ptr<Reducer> reducer_;
  bool sync_enabled_ = true;
  std::shared_ptr<detail::JoinChannel> join_;  // the live Join covering this DDP, if any
  int join_index_ = -1;
};

}  // namespace ember::dist

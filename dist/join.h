// Join: training on uneven inputs (torch.distributed.algorithms.join.Join's model). Ranks
// whose data runs out early keep taking part in the collectives of the ranks still
// training, with a contribution that changes nothing, instead of leaving them hanging.
//
//   dist::DistributedSampler sampler(dataset.size(), *group, {.pad = false});  // uneven shards
//   {
//     dist::Join join({ddp});                   // before the loop; PyTorch: with Join([ddp]):
//     for (auto& batch : loader) { ...(*ddp)(x)...; loss.backward(); sgd.step(); }
//     join.join();                              // out of data: shadow the others until all are
//   }
//
// Covered: every DistributedDataParallel among the given modules and every SyncBatchNorm
// inside them (a SyncBatchNorm model may be listed on its own too); all must use one process
// group. While a rank trains, each collective these modules issue (DDP's buffer broadcasts,
// bucket rebuild and gradient all-reduces, SyncBatchNorm's statistics exchange and backward
// all-reduce) is announced first by a small all-gather; ranks that joined wait for the
// announcements and issue the same collective with zeros: zero gradients, zero count and
// sums in SyncBatchNorm's statistics, which so cover the active ranks' batches only. Any
// order works (SyncBatchNorm's backward interleaved with DDP's buckets, no_sync()
// accumulation, evaluation forwards). Every DDP forward also counts the ranks still
// training (PyTorch's notify_join_context): DDP's gradient sum is divided by the initial
// world size (divide_by_initial_world_size, the default, as PyTorch) or by that count, and
// buffers are broadcast from the highest active rank instead of rank 0 (which may have
// joined with stale buffers). When every rank has joined, each DDP broadcasts its
// parameters and buffers from the highest-ranked of the last ranks to join (PyTorch's
// post-hook), so the models are equal everywhere again. Optimizer state (momentum) is not
// synchronised: a rank that joined early keeps the state of its last step, as in PyTorch.
//
// Gradient accumulation: a rank that runs out inside a no_sync() window drops the
// micro-batches it accumulated since its last synced backward (they never reach the others,
// as in PyTorch); the others' later synced backwards are shadowed with zeros as usual.
//
// Cost while enabled, even before any rank joins: one small blocking all-gather (rank count
// x 7 int64) per DDP forward and one not waited for before each other covered collective
// (buffer broadcast, gradient bucket, SyncBatchNorm exchange).
//
// Other collectives inside the Join (the user's own all_reduce of a loss, a barrier) are
// not shadowed and hang the active ranks until the group's timeout, as in PyTorch; so does
// a joined rank whose peers spend longer than the timeout between two collectives. Every
// rank must construct the Join with the same modules and options.
//
// join() is explicit because it communicates and can fail (a peer died, a timeout): it
// throws ember::Error like any collective. The destructor only finishes what join() would
// have done when the scope ends normally without it (like std::jthread); when an exception
// leaves the scope it communicates nothing (as PyTorch's __exit__), and if its own join
// fails it reports the error on stderr and calls std::terminate, since a destructor cannot
// throw and a half-joined rank would leave the others inconsistent.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ember/nn/module.h>

#include "process_group.h"

namespace ember::dist {

class DistributedDataParallel;
class Join;
class ZeroRedundancyOptimizer;
class SyncBatchNorm;

struct JoinOptions {
  // false: the Join does nothing and DDP behaves as without it (uneven inputs then hang).
  bool enable = true;
  // A rank that runs out while others still train makes every rank throw ember::Error
  // (the joined one from join(), the others from their next DDP forward or SyncBatchNorm
  // collective) instead of shadowing. Costs a wait for each announcement on active ranks.
  bool throw_on_early_termination = false;
  // DDP divides the gradient sum by the initial world size (true, PyTorch's default) or by
  // the number of ranks still training in that iteration (false).
  bool divide_by_initial_world_size = true;
};

namespace detail {

// The link between a Join and the modules it covers. Internal: DDP and SyncBatchNorm
// announce here each collective they are about to issue while their rank trains.
class JoinChannel {
 public:
  enum class Op : int64_t {
    kNone = 0,
    kForward = 1,         // a DDP forward: counts the active ranks
    kAllreduce = 2,       // shadowed with zeros (sum or average only)
    kAllgather = 3,       // shadowed with zeros
    kBroadcast = 4,       // shadowed by receiving into scratch
    kRebuildBuckets = 5,  // DDP rebuilds its buckets (a broadcast from rank 0)
    kZeroStep = 6,        // a ZeroRedundancyOptimizer steps: joined ranks step their shards too
  };
  struct ForwardInfo {
    int active_ranks = 0;        // ranks still training, this one included
    int authoritative_rank = 0;  // the highest of them
    std::vector<int> active;     // all of them, ascending
  };

  JoinChannel(std::shared_ptr<ProcessGroup> group, JoinOptions options);

  // True while this rank trains inside an enabled Join: the covered modules announce.
  bool announcing() const { return state_ == State::kTraining; }
  const JoinOptions& options() const { return options_; }
  ProcessGroup& group() { return *group_; }

  // A DDP forward (`joinable`: the DDP's index in this Join); waits for the count.
  ForwardInfo announce_forward(int joinable);
  // The same for another operation whose callers need the count (a ZeRO step).
  ForwardInfo announce_and_wait(Op op, int joinable);
  // Announces `op` over `tensor` (its dtype and size; root for broadcasts, reduce op for
  // all-reduces) before the caller issues it.
  void announce(Op op, const Tensor& tensor, int root = 0, ReduceOp reduce = ReduceOp::kSum,
                int joinable = -1);

 private:
  friend class ::ember::dist::Join;
  enum class State { kTraining, kShadowing, kDone };
  struct Pending {
    Tensor input;
    std::vector<Tensor> outputs;
    WorkHandle work;
  };
  // The descriptors every rank sent in one announcement round, [world][kFields].
  std::vector<std::vector<int64_t>> exchange(const std::vector<int64_t>& mine);
  std::vector<int64_t> describe(Op op, const Tensor& tensor, int root, ReduceOp reduce,
                                int joinable) const;
  // Throws when a rank joined while others train and throw_on_early_termination is set.
  void check_termination(const std::vector<std::vector<int64_t>>& all);
  void wait_pending();

  std::shared_ptr<ProcessGroup> group_;
  JoinOptions options_;
  State state_ = State::kTraining;
  bool terminated_ = false;  // an early termination was detected and thrown
  std::vector<Pending> pending_;
};

}  // namespace detail

class Join {
 public:
  // `joinables`: DistributedDataParallel modules and modules containing SyncBatchNorm
  // layers (searched recursively, so a DDP over a SyncBatchNorm model covers both). Each
  // may be covered by one live Join at a time.
  explicit Join(std::vector<std::shared_ptr<nn::Module>> joinables, JoinOptions options = {});
  // Also ZeroRedundancyOptimizers (PyTorch: Join([model, optim]); ember: Join({ddp}, {&opt},
  // {}), the options given so that the call is not ambiguous), over the same group: each
  // step on the ranks still training is announced, and a rank that joined steps its own shard
  // with the gradients it shadowed (the active ranks' average) and broadcasts it, so every
  // shard keeps being updated. Not with gradient sharding (ZeRO-2).
  Join(std::vector<std::shared_ptr<nn::Module>> joinables,
       std::vector<ZeroRedundancyOptimizer*> optimizers, JoinOptions options);
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank is out of inputs: shadows the active ranks' collectives until every rank has
  // joined, then makes each DDP's model equal on all ranks. Returns at once when disabled
  // or when called again. ember::Error on a failed collective, on active ranks that
  // announce different collectives, and under throw_on_early_termination.
  void join();

  bool joined() const { return joined_; }
  // After join(): how many collectives of other ranks this rank shadowed (0 for the last
  // ranks to join), and whether it was among the last.
  int64_t shadowed_rounds() const { return shadowed_rounds_; }
  bool is_last_joiner() const { return joined_ && shadowed_rounds_ == 0; }

 private:
  void release();  // the covered modules stop announcing

  std::vector<std::shared_ptr<nn::Module>> joinables_;
  std::vector<DistributedDataParallel*> ddps_;
  std::vector<SyncBatchNorm*> sync_bns_;
  std::vector<ZeroRedundancyOptimizer*> zeros_;
  std::shared_ptr<detail::JoinChannel> channel_;
  JoinOptions options_;
  int uncaught_at_start_;
  bool joined_ = false;
  bool failed_ = false;  // join() threw: the ranks are out of step
  bool released_ = false;
  int64_t shadowed_rounds_ = 0;
};

}  // namespace ember::dist

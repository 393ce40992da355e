// ZeroRedundancyOptimizer: the optimizer state sharded across ranks (ZeRO stage 1), as
// torch.distributed.optim.ZeroRedundancyOptimizer; with DistributedDataParallel's gradient
// sharding it is ZeRO stage 2.
//
//   auto ddp = std::make_shared<dist::DistributedDataParallel>(model);
//   dist::ZeroRedundancyOptimizer opt(ddp->parameters(),
//                                     dist::optimizer_factory<optim::AdamW>(
//                                         optim::AdamWOptions{.lr = 1e-3}));
//   opt.shard_gradients(*ddp);  // optional: ZeRO-2
//   loss.backward();
//   opt.step();                 // steps this rank's shard, then every rank has every update
//
// Partition, as PyTorch's: for each parameter group in turn, its parameters by size (numel,
// largest first, ties in group order) each go to the rank whose shard holds the fewest
// elements so far (the lowest such rank on a tie); the totals carry over from one group to
// the next. Every rank computes the same partition from the groups alone. A rank's shard is
// stepped by an optimizer the factory builds over that rank's parameters (each of its groups
// keeps the options of the group it came from; a group with none of them is left out), and
// after each step every rank broadcasts its updated parameters (packed per dtype and device)
// to the others. So each rank holds the optimizer state (momentum, Adam's moments) of its
// shard only: about 1 / world size of it.
//
// ZeRO-2 (shard_gradients(ddp)): the DDP uses this same partition, so a rank receives exactly
// the gradients its own optimizer reads. Each of the DDP's buckets is laid out rank by rank in
// the partition's order of owners, and its sum reaches each owner by one reduce per owner
// instead of one all-reduce; once a bucket's reduction is done the rank keeps its own
// parameters' gradients (a compact copy) and drops the others' (grad() undefined), and the
// bucket's memory is released until a gradient arrives there again: between steps a rank
// holds its shard's gradients only. Under no_sync() gradients accumulate in full locally, as
// in FSDP. With dropped gradients:
// - clip with clip_grad_norm_ below (the global norm), not optim::clip_grad_norm_ over the
//   model's parameters, which would see this rank's shard only (as FSDP's clip_grad_norm_);
// - GradScaler agrees its found-inf flag across the ranks through agree_found_inf below, so
//   every rank steps or skips together.
//
// state_dict(): the plain optimizer's format (the factory's optimizer over all groups), once
// consolidate_state_dict(to) gathered every shard's state onto rank `to` (collective, point to
// point to `to`, which so holds the whole state for a while). state_dict() elsewhere is an
// ember::Error, as PyTorch's raises, and so is one after a later step or load (PyTorch would
// return the stale state). load_state_dict()
// takes that format, from a ZeRO run or a plain one at any world size, and keeps this rank's
// shard. So a DDP checkpoint resumes under ZeRO and a ZeRO one without it.
//
// Results equal DDP + the plain optimizer: the updates are the plain optimizer's, parameter by
// parameter; ZeRO-2's reduce gives the all-reduce's bits at 2 ranks (on the CPU: bitwise at 2
// ranks, rounding of the summation order at more).
//
// GradScaler takes its host path with this optimizer (device_step_refusal() is never empty):
// every rank must call step() or none, since step() broadcasts. Uneven inputs: list it in the
// dist::Join with the DDP (Join({ddp}, {&opt}, {})), as PyTorch's Join([model, optim]); a rank
// that ran out keeps stepping its shard, with the gradients the ranks still training use
// (after their clipping or unscaling: each step sends them to it; ZeRO-1 only). Not
// supported: capturable steps, and add_param_group after construction (an ember::Error); the
// wrapped optimizer's param_groups() are refreshed from this one's before each step, so LR
// schedules work on this optimizer as on any.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ember/optim/optimizer.h>

#include "process_group.h"

namespace ember::dist {

class DistributedDataParallel;
class Join;
namespace detail {
class JoinChannel;
}

// Builds the optimizer of one rank's shard over its groups (options complete).
using OptimizerFactory =
    std::function<std::unique_ptr<optim::Optimizer>(std::vector<optim::ParamGroup>)>;

// The factory of optimizer `Opt` (optim::SGD, optim::AdamW, ...) with `defaults`, as
// PyTorch's optimizer_class and **defaults: optimizer_factory<optim::SGD>(optim::SGDOptions{...}).
template <class Opt, class Defaults>
OptimizerFactory optimizer_factory(Defaults defaults) {
  return [defaults](std::vector<optim::ParamGroup> groups) -> std::unique_ptr<optim::Optimizer> {
    return std::make_unique<Opt>(std::move(groups), defaults);
  };
}

class ZeroRedundancyOptimizer : public optim::Optimizer {
 public:
  // Over `group` (every rank of it constructs one with the same groups, in the same order).
  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, OptimizerFactory make,
                          std::shared_ptr<ProcessGroup> group);
  ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerFactory make,
                          std::shared_ptr<ProcessGroup> group);
  // Over the default group (ember::Error before init_process_group()).
  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, OptimizerFactory make);
  ZeroRedundancyOptimizer(std::vector<Tensor> params, OptimizerFactory make);
  ~ZeroRedundancyOptimizer() override;

  // The rank (of the group) whose shard holds parameter `index` of group `group`, or `param`
  // (ember::Error when it is none of this optimizer's parameters).
  int owner(size_t group, size_t index) const;
  int owner(const Tensor& param) const;
  // The elements of each rank's shard, by rank.
  const std::vector<int64_t>& shard_numels() const { return shard_numels_; }
  // The optimizer stepping this rank's shard (PyTorch's .optim); null when the shard is empty.
  optim::Optimizer* local_optimizer() { return local_.get(); }
  ProcessGroup& group() { return *group_; }

  // ZeRO-2: makes `ddp` (over the same group and parameters) reduce each gradient to its
  // owner and drop the others' after the reduction (see the top of this file). Every rank
  // calls it, between iterations.
  void shard_gradients(DistributedDataParallel& ddp);
  bool shards_gradients() const { return shards_gradients_; }

  // Gathers every shard's state onto rank `to` (a rank of the group), collectively: every
  // rank calls it; then state_dict() on `to` returns the whole state.
  void consolidate_state_dict(int to = 0);
  // The consolidated state in the plain optimizer's format (its "type.<name>", groups and
  // per-parameter "state.<k>" keys). ember::Error on a rank that holds no consolidated state,
  // or when a step or load came after the consolidation.
  optim::StateDict state_dict() const override;
  // The plain optimizer's format (checked as it checks it); keeps this rank's shard's state
  // and every group's options. Every rank calls it with the same dict, or with the part of it
  // owns_state_key() accepts (its scalars whole, its own parameters' tensors alone).
  void load_state_dict(const optim::StateDict& dict) override;
  // load_state_dict of the part owns_state_key() accepts (another rank's parameter's tensor is
  // an ember::Error naming its owner), taken by value: each parameter's tensors are released
  // from `dict` once copied into its state, so a caller that gives the dict up (std::move, a
  // temporary) holds at most its own part plus one parameter's state while it loads.
  void load_own_state_dict(optim::StateDict dict);
  // This rank's part of the plain format, without gathering (not collective): the type and
  // group keys, and the "state.<k>.*" entries of the parameters this rank owns (k: the index
  // over all groups). The ranks' parts together are the consolidated state_dict(); a sharded
  // snapshot saves each rank's (dist::add_state_dict).
  optim::StateDict shard_state_dict() const;
  // Whether state dict key `key` belongs to this rank's part: "state.<k>.*" of a parameter it
  // owns, or a key of no parameter. With ShardedCheckpoint::read_state_dict a rank of any world
  // size reads its own parameters' state alone, never the whole (then load_own_state_dict).
  bool owns_state_key(const std::string& key) const;

  // optim::clip_grad_norm_ over every parameter, as on one rank: under ZeRO-1 each rank holds
  // every gradient and clips alone; under ZeRO-2 each rank's parameter norms are exchanged by
  // one all-reduce (collective) and combined in parameter order as optim::clip_grad_norm_
  // combines them, so the total is its total, and every gradient present is scaled by
  // min(1, max_norm / (total + 1e-6)). Returns the total norm.
  Tensor clip_grad_norm_(double max_norm, double norm_type = 2.0);

  std::string device_step_refusal() const override;
  // Own parameters' state; ember::Error naming the owner for another rank's parameter.
  const optim::ParamState& state(size_t group, size_t index) const override;
  // Under ZeRO-2: one max all-reduce of the flags (combined into one on the group's device),
  // so that ranks holding different gradients decide alike. Under ZeRO-1 every rank holds the
  // same gradients: nothing to agree.
  void agree_found_inf(std::vector<std::pair<Device, Tensor>>& flags) override;

 protected:
  void check_options(const optim::Options& options) const override;
  void step_group(optim::ParamGroup& group, std::vector<optim::ParamState>& state,
                  const DeviceInputs& device) override;
  void run_step(const optim::StepScaling* scaling) override;

 private:
  friend class Join;
  // Join's hook: enlists (or, with null, releases) this optimizer as `index` of a Join.
  void set_join(std::shared_ptr<detail::JoinChannel> channel, int index);
  // On a rank that joined, when the ranks still training (`active`) step: as they do.
  void join_step(const std::vector<int>& active);
  // Under a Join: the gradients of the joined ranks' shards, as the active ranks will use them
  // (clipped, unscaled), from the highest active rank to every rank.
  void share_joined_gradients(const std::vector<int>& active);
  // The local step, then every shard's broadcast.
  void step_and_broadcast();
  // Rank `rank`'s parameters, in partition order.
  std::vector<Tensor> shard_of(int rank) const;

  // `reference`: the factory's optimizer over all groups, which checked them (its defaults).
  ZeroRedundancyOptimizer(std::vector<optim::ParamGroup> groups, OptimizerFactory make,
                          std::shared_ptr<ProcessGroup> group,
                          std::unique_ptr<optim::Optimizer> reference);
  // The factory's optimizer over every group with this optimizer's current options.
  std::unique_ptr<optim::Optimizer> make_full() const;
  // make_full() holding this rank's parameters' state.
  std::unique_ptr<optim::Optimizer> full_with_own_state() const;
  // ember::Error when param_groups() no longer holds the parameters partitioned.
  void check_groups_unchanged(const char* op) const;
  // Sends this rank's shard's state to `to` (a rank other than this one) / receives rank
  // `from`'s into `full`.
  void send_shard_state(int to);
  void receive_shard_state(int from, optim::Optimizer& full);

  std::shared_ptr<ProcessGroup> group_;
  OptimizerFactory make_;
  bool constructed_ = false;
  bool shards_gradients_ = false;
  std::shared_ptr<detail::JoinChannel> join_;  // the live Join covering this optimizer, if any
  int join_index_ = -1;
  std::vector<std::vector<int>> owner_;           // [group][index]: the owning rank
  std::vector<std::vector<Tensor>> partitioned_;  // the parameters as partitioned
  std::vector<int64_t> shard_numels_;
  // Where each own parameter sits in local_: [group] -> local group (-1: none of ours), and
  // [group][index] -> local index (-1: another rank's).
  std::vector<int> local_group_;
  std::vector<std::vector<int>> local_index_;
  std::unique_ptr<optim::Optimizer> local_;
  // The consolidated state (on the rank it was gathered to) and when it was taken.
  optim::StateDict consolidated_;
  int consolidated_on_ = -1;
  int64_t steps_ = 0, consolidated_at_ = -1;
};

}  // namespace ember::dist

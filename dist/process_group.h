// Process groups: the collectives ranks use to exchange tensors. Every call is issued
// asynchronously in call order (all ranks must issue the same collectives in the same order)
// and returns a Work that can be tested or waited on; a wait never hangs forever: it raises
// ember::Error naming the collective, its sequence number and the rank after the timeout.
// new_group() makes subgroups (see there); roots and peers are always ranks of the group the
// call is made on.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::dist {

// torch.distributed.ReduceOp's reductions across ranks (a reduction within a tensor is the
// kernel table's detail::ReduceOp, a separate enum on purpose: see tensor/detail/kernel_table.h).
enum class ReduceOp { kSum, kAvg, kMax, kMin };
inline constexpr int kNumReduceOps = 4;

// A collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // True once the collective finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
  // Blocks until done; ember::Error on failure or after `timeout` (0: the group's timeout).
  // NCCL, with timeout 0: orders the caller's current CUDA stream after the collective
  // instead, and a watchdog enforces the timeout (see nccl_process_group.h).
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
};
using WorkHandle = std::shared_ptr<Work>;

struct ProcessGroupOptions {
  // Every wait's limit; must be positive. Values beyond 30 days count as 30 days, so
  // std::chrono::milliseconds::max() means "as good as never".
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  // The MPI and TCP groups always check, before each collective, that every rank issued the
  // same one with the same shapes and dtypes, naming each rank's call when not, and that no
  // rank left the group (a rank that leaves says goodbye). NCCL checks that only with this
  // set (also switched on by EMBER_DIST_DEBUG=1): it costs each NCCL call a host wait.
  bool debug = false;
  // NCCL: every wait holds the host until its collective is done and raises ember::Error on
  // a timeout or an NCCL error, instead of ordering the stream under the watchdog (PyTorch's
  // TORCH_NCCL_BLOCKING_WAIT). The watchdog then ends the process only when the group is
  // destroyed with a collective nobody waited on that failed or is past its deadline.
  // Other backends always hold the host.
  bool blocking_wait = false;
};

// One operation as a BackendGroup's transport receives it (dist/detail/engine.h).
struct CollectiveRequest;

// What a backend gets to make a subgroup's communicator (see ProcessGroup::new_group).
struct SubgroupSpec {
  std::vector<int> ranks;         // the members as ranks of the parent, sorted
  std::vector<int> global_ranks;  // the same members as ranks of the job
  int rank = -1;       // this process's index in `ranks` (its rank in the subgroup); -1: no member
  int64_t serial = 0;  // the parent's count of new_group calls, this one included
  std::optional<ProcessGroupOptions> options;  // none: the parent's
};

// Tensors are passed as handles: collectives write results into their storage in place.
// Inputs must be contiguous; all ranks pass the same shapes and dtypes.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  // This process's rank in the group; -1 in the group new_group() gives a non-member.
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  bool is_member() const { return rank_ >= 0; }
  // The job's rank (the default group's) of this process, and of the group's rank `r`, as
  // torch.distributed.get_global_rank(group, r); they equal the group ranks in a group made
  // over the whole job.
  int global_rank() const { return global_rank_; }
  int global_rank(int group_rank) const;
  // The job's ranks of the members, in group-rank order.
  const std::vector<int>& global_ranks() const { return global_ranks_; }

  // A group over some of this group's ranks, as torch.distributed.new_group(ranks): every
  // rank of this group calls it, with the same `ranks` (ranks of this group, in any order;
  // like PyTorch's they are sorted, and a member's rank in the new group is its index in
  // that order), creating its subgroups in the same order. Members get a working group of
  // the same backend, timeout and debug mode unless `options` says otherwise; every other
  // rank gets a group whose collectives throw ember::Error (PyTorch returns a marker object
  // there, which fails later and less clearly). Throws ember::Error for an empty list, a
  // repeated rank or one outside [0, size()). The subgroup may outlive this group object.
  // Call it from one thread at a time, like every collective.
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                          std::optional<ProcessGroupOptions> options = {});
  virtual std::string backend() const = 0;  // "mpi", "nccl", "tcp", "single"
  // Where ember's own small exchanges over this group (DDP's checks, average_across_ranks)
  // keep their tensors: the CPU, or an NCCL group's GPU (NCCL moves CUDA tensors only).
  virtual Device tensor_device() const { return kCPU; }

  virtual WorkHandle allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  virtual WorkHandle broadcast(const Tensor& tensor, int root) = 0;
  // outputs[r] receives rank r's input.
  virtual WorkHandle allgather(const std::vector<Tensor>& outputs, const Tensor& input) = 0;
  // The reduction lands in `tensor` on `root`.
  virtual WorkHandle reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum) = 0;
  // output receives the reduction of every rank's inputs[rank()].
  virtual WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                    ReduceOp op = ReduceOp::kSum) = 0;
  virtual WorkHandle barrier() = 0;
  virtual WorkHandle send(const Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkHandle recv(const Tensor& tensor, int src, int tag = 0) = 0;

 protected:
  // A group over the job's ranks 0 .. size - 1 (its group ranks are the job's).
  ProcessGroup(int rank, int size, int local_rank);
  // A subgroup: the job's ranks of its members, and this process's job rank.
  ProcessGroup(int rank, int local_rank, std::vector<int> global_ranks, int global_rank);

  // The backend's one step of new_group(): a communicator over spec.ranks. Every rank of this
  // group calls it, in the same order; a non-member (spec.rank -1) returns null, after taking
  // part where its transport needs it (NCCL's split). The default throws: no subgroups.
  virtual std::shared_ptr<ProcessGroup> make_subgroup(const SubgroupSpec& spec);

 private:
  int rank_, size_, local_rank_;
  int global_rank_;
  std::vector<int> global_ranks_;
  int64_t subgroups_made_ = 0;
};

// The base of ember's backends. Each public collective becomes one CollectiveRequest, checked
// once here (tensors, roots, peers, tags, lists, reduce ops), and goes to the backend's
// transport through submit(); a backend overrides that and, for rules of its own (the
// devices it moves), check_devices().
class BackendGroup : public ProcessGroup {
 public:
  WorkHandle allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) final;
  WorkHandle broadcast(const Tensor& tensor, int root) final;
  WorkHandle allgather(const std::vector<Tensor>& outputs, const Tensor& input) final;
  WorkHandle reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum) final;
  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                            ReduceOp op = ReduceOp::kSum) final;
  WorkHandle barrier() final;
  WorkHandle send(const Tensor& tensor, int dst, int tag = 0) final;
  WorkHandle recv(const Tensor& tensor, int src, int tag = 0) final;

 protected:
  using ProcessGroup::ProcessGroup;
  // Runs a checked request: issues it and returns its Work.
  virtual WorkHandle submit(const CollectiveRequest& request) = 0;
  // The backend's own rules for the request's tensors, after the shared checks; throws
  // ember::Error naming the operation.
  virtual void check_devices(const CollectiveRequest& request) const;

 private:
  WorkHandle checked(const CollectiveRequest& request);
};

}  // namespace ember::dist

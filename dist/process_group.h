// Process groups: the collectives ranks use to exchange tensors. Every call is issued
// asynchronously in call order (all ranks must issue the same collectives in the same order)
// and returns a Work that can be tested or waited on; a wait never hangs forever: it raises
// ember::Error naming the collective, its sequence number and the rank after the timeout.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <ember/tensor/tensor.h>

namespace ember::dist {

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
  // Checks that every rank issues the same collective with the same shapes and dtypes, and
  // names the first rank that differs (also switched on by EMBER_DIST_DEBUG=1).
  bool debug = false;
  // NCCL: every wait holds the host until its collective is done and raises ember::Error on
  // a timeout or an NCCL error, instead of ordering the stream under the watchdog (PyTorch's
  // TORCH_NCCL_BLOCKING_WAIT). The watchdog then ends the process only when the group is
  // destroyed with a collective nobody waited on that failed or is past its deadline.
  // Other backends always hold the host.
  bool blocking_wait = false;
};

// Tensors are passed as handles: collectives write results into their storage in place.
// Inputs must be contiguous; all ranks pass the same shapes and dtypes.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
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
  ProcessGroup(int rank, int size, int local_rank)
      : rank_(rank), size_(size), local_rank_(local_rank) {}

 private:
  int rank_, size_, local_rank_;
};

}  // namespace ember::dist

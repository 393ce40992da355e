// The NCCL backend (CUDA builds only): CUDA tensors on the group's own high-priority stream.
// Each collective waits (an event recorded on the caller's current stream) for the work that
// produced its tensors, runs on the NCCL stream, and Work::wait() polls its completion event
// with the timeout, checking ncclCommGetAsyncError, then orders the caller's current stream
// after it. On a timeout or an asynchronous error the communicator is aborted, the Work
// throws ember::Error naming the collective, its number and the rank, and every later call on
// the group throws.
#pragma once

#include <array>
#include <memory>

#include <ember/config.h>
#include <ember/dist/process_group.h>

#if EMBER_WITH_CUDA

namespace ember::dist {

class NcclProcessGroup : public ProcessGroup {
 public:
  using UniqueId = std::array<char, 128>;  // ncclUniqueId's bytes
  // Made once (by rank 0) and handed to every rank by the launcher's channel (MPI or TcpStore).
  static UniqueId create_unique_id();

  // Collective over all `size` ranks: each passes the same id and uses CUDA device `device`.
  // Initialisation itself is bounded by options.timeout.
  NcclProcessGroup(int rank, int size, int local_rank, int device, const UniqueId& id,
                   ProcessGroupOptions options = {});
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  std::string backend() const override { return "nccl"; }
  int device() const;
  WorkHandle allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  WorkHandle broadcast(const Tensor& tensor, int root) override;
  WorkHandle allgather(const std::vector<Tensor>& outputs, const Tensor& input) override;
  WorkHandle reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum) override;
  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                            ReduceOp op = ReduceOp::kSum) override;
  WorkHandle barrier() override;
  // NCCL matches point-to-point operations by order, not tag: `tag` must be 0.
  WorkHandle send(const Tensor& tensor, int dst, int tag = 0) override;
  WorkHandle recv(const Tensor& tensor, int src, int tag = 0) override;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace ember::dist

#endif  // EMBER_WITH_CUDA

// World size 1 without MPI or NCCL: every collective leaves its tensor as it is (or copies
// it where the result lands elsewhere) and is complete on return; send/recv have no peer.
#pragma once

#include <ember/dist/process_group.h>

namespace ember::dist {

class SingleProcessGroup : public ProcessGroup {
 public:
  SingleProcessGroup() : ProcessGroup(0, 1, 0) {}

  std::string backend() const override { return "single"; }
  WorkHandle allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) override;
  WorkHandle broadcast(const Tensor& tensor, int root) override;
  WorkHandle allgather(const std::vector<Tensor>& outputs, const Tensor& input) override;
  WorkHandle reduce(const Tensor& tensor, int root, ReduceOp op = ReduceOp::kSum) override;
  WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                            ReduceOp op = ReduceOp::kSum) override;
  WorkHandle barrier() override;
  // Both throw ember::Error: a group of one has no one to talk to.
  WorkHandle send(const Tensor& tensor, int dst, int tag = 0) override;
  WorkHandle recv(const Tensor& tensor, int src, int tag = 0) override;
};

}  // namespace ember::dist

#include "api.h"

#include "detail/default_group.h"

namespace ember::dist {

namespace {

using detail::default_group_for;

WorkHandle finish(WorkHandle work, bool async_op) {
  if (!async_op) work->wait();
  return work;
}

}  // namespace

int get_rank() { return default_group_for("get_rank")->rank(); }
int get_world_size() { return default_group_for("get_world_size")->size(); }
int get_local_rank() { return default_group_for("get_local_rank")->local_rank(); }
std::string get_backend() { return default_group_for("get_backend")->backend(); }

WorkHandle all_reduce(const Tensor& tensor, ReduceOp op, bool async_op) {
  return finish(default_group_for("all_reduce")->allreduce(tensor, op), async_op);
}

WorkHandle reduce(const Tensor& tensor, int dst, ReduceOp op, bool async_op) {
  return finish(default_group_for("reduce")->reduce(tensor, dst, op), async_op);
}

WorkHandle broadcast(const Tensor& tensor, int src, bool async_op) {
  return finish(default_group_for("broadcast")->broadcast(tensor, src), async_op);
}

WorkHandle all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor, bool async_op) {
  return finish(default_group_for("all_gather")->allgather(tensor_list, tensor), async_op);
}

WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list, ReduceOp op,
                          bool async_op) {
  return finish(default_group_for("reduce_scatter")->reduce_scatter(output, input_list, op),
                async_op);
}

WorkHandle barrier(bool async_op) {
  return finish(default_group_for("barrier")->barrier(), async_op);
}

void send(const Tensor& tensor, int dst, int tag) {
  default_group_for("send")->send(tensor, dst, tag)->wait();
}

void recv(const Tensor& tensor, int src, int tag) {
  default_group_for("recv")->recv(tensor, src, tag)->wait();
}

WorkHandle isend(const Tensor& tensor, int dst, int tag) {
  return default_group_for("isend")->send(tensor, dst, tag);
}

WorkHandle irecv(const Tensor& tensor, int src, int tag) {
  return default_group_for("irecv")->recv(tensor, src, tag);
}

}  // namespace ember::dist

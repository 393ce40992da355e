#include "api.h"

#include <algorithm>

#include "detail/default_group.h"
#include "detail/engine.h"
#include "detail/flight.h"

namespace ember::dist {

namespace {

using detail::default_group_for;

WorkHandle finish(WorkHandle work, bool async_op) {
  if (!async_op) work->wait();
  return work;
}

// The rank of `group` that the job's rank `global` is, for the free functions, which take
// global ranks as torch.distributed's do. On a non-member any value does: its call throws.
int group_rank_of(const ProcessGroup& group, int global, const char* op, const char* what) {
  if (!group.is_member()) return 0;
  const auto& ranks = group.global_ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), global);
  EMBER_CHECK(it != ranks.end(), op, what, " ", global, " is not a member of group ",
              detail::ranks_str(ranks), " (", what,
              " is a global rank, as in torch.distributed; ProcessGroup's own methods take "
              "ranks of the group)");
  return static_cast<int>(it - ranks.begin());
}

// `group`, or the default group when it is null.
std::shared_ptr<ProcessGroup> group_or_default(const std::shared_ptr<ProcessGroup>& group,
                                               const char* op) {
  return group != nullptr ? group : default_group_for(op);
}

}  // namespace

int get_rank() { return default_group_for("get_rank")->rank(); }
int get_world_size() { return default_group_for("get_world_size")->size(); }
int get_local_rank() { return default_group_for("get_local_rank")->local_rank(); }
std::string get_backend() { return default_group_for("get_backend")->backend(); }

int get_rank(const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group, "get_rank")->rank();
}

int get_world_size(const std::shared_ptr<ProcessGroup>& group) {
  return group_or_default(group, "get_world_size")->size();
}

int get_global_rank(const std::shared_ptr<ProcessGroup>& group, int group_rank) {
  return group_or_default(group, "get_global_rank")->global_rank(group_rank);
}

int get_group_rank(const std::shared_ptr<ProcessGroup>& group, int global_rank) {
  const auto& ranks = group_or_default(group, "get_group_rank")->global_ranks();
  const auto it = std::find(ranks.begin(), ranks.end(), global_rank);
  return it == ranks.end() ? -1 : static_cast<int>(it - ranks.begin());
}

std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks,
                                        std::optional<ProcessGroupOptions> options) {
  return default_group_for("new_group")->new_group(ranks, std::move(options));
}

WorkHandle all_reduce(const Tensor& tensor, ReduceOp op, bool async_op,
                      std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(default_group_for("all_reduce")->allreduce(tensor, op), async_op);
}

WorkHandle reduce(const Tensor& tensor, int dst, ReduceOp op, bool async_op,
                  std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(default_group_for("reduce")->reduce(tensor, dst, op), async_op);
}

WorkHandle broadcast(const Tensor& tensor, int src, bool async_op, std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(default_group_for("broadcast")->broadcast(tensor, src), async_op);
}

WorkHandle all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor, bool async_op,
                      std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(default_group_for("all_gather")->allgather(tensor_list, tensor), async_op);
}

WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list, ReduceOp op,
                          bool async_op, std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(default_group_for("reduce_scatter")->reduce_scatter(output, input_list, op),
                async_op);
}

WorkHandle barrier(bool async_op, std::source_location where) {
  const detail::CallSiteScope site(where);
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

WorkHandle all_reduce(const Tensor& tensor, ReduceOp op, const std::shared_ptr<ProcessGroup>& group,
                      bool async_op, std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(group_or_default(group, "all_reduce")->allreduce(tensor, op), async_op);
}

WorkHandle reduce(const Tensor& tensor, int dst, ReduceOp op,
                  const std::shared_ptr<ProcessGroup>& group, bool async_op,
                  std::source_location where) {
  const detail::CallSiteScope site(where);
  const auto g = group_or_default(group, "reduce");
  return finish(g->reduce(tensor, group_rank_of(*g, dst, "reduce", "dst"), op), async_op);
}

WorkHandle broadcast(const Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group,
                     bool async_op, std::source_location where) {
  const detail::CallSiteScope site(where);
  const auto g = group_or_default(group, "broadcast");
  return finish(g->broadcast(tensor, group_rank_of(*g, src, "broadcast", "src")), async_op);
}

WorkHandle all_gather(const std::vector<Tensor>& tensor_list, const Tensor& tensor,
                      const std::shared_ptr<ProcessGroup>& group, bool async_op,
                      std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(group_or_default(group, "all_gather")->allgather(tensor_list, tensor), async_op);
}

WorkHandle reduce_scatter(const Tensor& output, const std::vector<Tensor>& input_list, ReduceOp op,
                          const std::shared_ptr<ProcessGroup>& group, bool async_op,
                          std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(group_or_default(group, "reduce_scatter")->reduce_scatter(output, input_list, op),
                async_op);
}

WorkHandle barrier(const std::shared_ptr<ProcessGroup>& group, bool async_op,
                   std::source_location where) {
  const detail::CallSiteScope site(where);
  return finish(group_or_default(group, "barrier")->barrier(), async_op);
}

void send(const Tensor& tensor, int dst, const std::shared_ptr<ProcessGroup>& group, int tag) {
  const auto g = group_or_default(group, "send");
  g->send(tensor, group_rank_of(*g, dst, "send", "dst"), tag)->wait();
}

void recv(const Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group, int tag) {
  const auto g = group_or_default(group, "recv");
  g->recv(tensor, group_rank_of(*g, src, "recv", "src"), tag)->wait();
}

WorkHandle isend(const Tensor& tensor, int dst, const std::shared_ptr<ProcessGroup>& group,
                 int tag) {
  const auto g = group_or_default(group, "isend");
  return g->send(tensor, group_rank_of(*g, dst, "isend", "dst"), tag);
}

WorkHandle irecv(const Tensor& tensor, int src, const std::shared_ptr<ProcessGroup>& group,
                 int tag) {
  const auto g = group_or_default(group, "irecv");
  return g->recv(tensor, group_rank_of(*g, src, "irecv", "src"), tag);
}

}  // namespace ember::dist

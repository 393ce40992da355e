#include "engine.h"

#include <algorithm>
#include <numeric>
#include <sstream>

namespace ember::dist {

namespace {

std::vector<int> every_rank(int size) {
  std::vector<int> ranks(static_cast<size_t>(std::max(size, 0)));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

}  // namespace

ProcessGroup::ProcessGroup(int rank, int size, int local_rank)
    : rank_(rank),
      size_(size),
      local_rank_(local_rank),
      global_rank_(rank),
      global_ranks_(every_rank(size)) {}

ProcessGroup::ProcessGroup(int rank, int local_rank, std::vector<int> global_ranks, int global_rank)
    : rank_(rank),
      size_(static_cast<int>(global_ranks.size())),
      local_rank_(local_rank),
      global_rank_(global_rank),
      global_ranks_(std::move(global_ranks)) {}

int ProcessGroup::global_rank(int group_rank) const {
  EMBER_CHECK(group_rank >= 0 && group_rank < size_, "global_rank", "rank ", group_rank,
              " is not a rank of group ", detail::ranks_str(global_ranks_));
  return global_ranks_[static_cast<size_t>(group_rank)];
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks,
                                                      std::optional<ProcessGroupOptions> options) {
  EMBER_CHECK(is_member(), "new_group", "this rank (global rank ", global_rank_,
              ") is not a member of group ", detail::ranks_str(global_ranks_),
              ", so it cannot make subgroups of it");
  EMBER_CHECK(!ranks.empty(), "new_group",
              "ranks is empty; list the ranks of the new group's members (0 to ", size_ - 1,
              " in this group)");
  SubgroupSpec spec;
  spec.ranks = ranks;
  std::sort(spec.ranks.begin(), spec.ranks.end());
  for (size_t i = 0; i < spec.ranks.size(); ++i) {
    const int r = spec.ranks[i];
    EMBER_CHECK(r >= 0 && r < size_, "new_group", "rank ", r, " in ", detail::ranks_str(ranks),
                " is not a rank of a group of ", size_, " (ranks 0 to ", size_ - 1, ")");
    EMBER_CHECK(i == 0 || spec.ranks[i - 1] != r, "new_group", "rank ", r, " appears twice in ",
                detail::ranks_str(ranks));
  }
  for (const int r : spec.ranks) spec.global_ranks.push_back(global_ranks_[static_cast<size_t>(r)]);
  // Counted on every rank, member or not, so the n-th subgroup of this group has the same
  // number everywhere (the TCP backend meets its members under it).
  spec.serial = ++subgroups_made_;
  const auto me = std::find(spec.ranks.begin(), spec.ranks.end(), rank_);
  spec.rank = me == spec.ranks.end() ? -1 : static_cast<int>(me - spec.ranks.begin());
  spec.options = options;
  std::shared_ptr<ProcessGroup> group = make_subgroup(spec);
  if (spec.rank < 0) return detail::make_non_member_group(*this, std::move(spec.global_ranks));
  EMBER_ASSERT(group != nullptr && group->rank() == spec.rank, "new_group: the ", backend(),
               " backend made no group for member ", spec.rank);
  return group;
}

std::shared_ptr<ProcessGroup> ProcessGroup::make_subgroup(const SubgroupSpec& spec) {
  throw Error(ember::detail::str_cat("new_group: the ", backend(),
                                     " process group cannot make subgroups (asked for ranks ",
                                     detail::ranks_str(spec.ranks), ")"));
}

WorkHandle BackendGroup::checked(const CollectiveRequest& request) {
  detail::check_request(request, rank(), size());
  check_devices(request);
  return submit(request);
}

void BackendGroup::check_devices(const CollectiveRequest& /*request*/) const {}

WorkHandle BackendGroup::allreduce(const Tensor& tensor, ReduceOp op) {
  return checked({.kind = detail::OpKind::kAllreduce, .tensor = &tensor, .reduce = op});
}

WorkHandle BackendGroup::broadcast(const Tensor& tensor, int root) {
  return checked({.kind = detail::OpKind::kBroadcast, .tensor = &tensor, .peer = root});
}

WorkHandle BackendGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  return checked({.kind = detail::OpKind::kAllgather, .tensor = &input, .list = &outputs});
}

WorkHandle BackendGroup::reduce(const Tensor& tensor, int root, ReduceOp op) {
  return checked({.kind = detail::OpKind::kReduce, .tensor = &tensor, .reduce = op, .peer = root});
}

WorkHandle BackendGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                        ReduceOp op) {
  return checked(
      {.kind = detail::OpKind::kReduceScatter, .tensor = &output, .list = &inputs, .reduce = op});
}

WorkHandle BackendGroup::barrier() { return checked({.kind = detail::OpKind::kBarrier}); }

WorkHandle BackendGroup::send(const Tensor& tensor, int dst, int tag) {
  return checked({.kind = detail::OpKind::kSend, .tensor = &tensor, .peer = dst, .tag = tag});
}

WorkHandle BackendGroup::recv(const Tensor& tensor, int src, int tag) {
  return checked({.kind = detail::OpKind::kRecv, .tensor = &tensor, .peer = src, .tag = tag});
}

namespace detail {

std::string ranks_str(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < ranks.size(); ++i) out << (i > 0 ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

namespace {

class NonMemberGroup final : public ProcessGroup {
 public:
  NonMemberGroup(const ProcessGroup& parent, std::vector<int> global_ranks)
      : ProcessGroup(-1, parent.local_rank(), std::move(global_ranks), parent.global_rank()),
        backend_(parent.backend()),
        device_(parent.tensor_device()) {}

  std::string backend() const override { return backend_; }
  Device tensor_device() const override { return device_; }
  WorkHandle allreduce(const Tensor&, ReduceOp) override { refuse("allreduce"); }
  WorkHandle broadcast(const Tensor&, int) override { refuse("broadcast"); }
  WorkHandle allgather(const std::vector<Tensor>&, const Tensor&) override { refuse("allgather"); }
  WorkHandle reduce(const Tensor&, int, ReduceOp) override { refuse("reduce"); }
  WorkHandle reduce_scatter(const Tensor&, const std::vector<Tensor>&, ReduceOp) override {
    refuse("reduce_scatter");
  }
  WorkHandle barrier() override { refuse("barrier"); }
  WorkHandle send(const Tensor&, int, int) override { refuse("send"); }
  WorkHandle recv(const Tensor&, int, int) override { refuse("recv"); }

 private:
  [[noreturn]] void refuse(const char* op) const {
    throw Error(ember::detail::str_cat(
        op, ": this rank (global rank ", global_rank(), ") is not a member of group ",
        ranks_str(global_ranks()),
        "; new_group() gives the other ranks a group only its members may use"));
  }
  std::string backend_;
  Device device_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_non_member_group(const ProcessGroup& parent,
                                                    std::vector<int> global_ranks) {
  return std::make_shared<NonMemberGroup>(parent, std::move(global_ranks));
}

}  // namespace detail

}  // namespace ember::dist

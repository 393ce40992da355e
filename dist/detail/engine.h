// The request every public collective of a BackendGroup becomes (see process_group.h), the
// checks made on it once for every backend, and the group new_group() gives non-members.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <ember/dist/process_group.h>

#include "common.h"

namespace ember::dist {

// One collective or point-to-point operation as its caller issued it. The pointers refer to
// the caller's arguments: valid until submit() returns, so a backend copies what it keeps.
struct CollectiveRequest {
  using OpKind = detail::OpKind;
  OpKind kind = OpKind::kBarrier;
  const Tensor* tensor = nullptr;             // allgather: the input; reduce_scatter: the output
  const std::vector<Tensor>* list = nullptr;  // allgather outputs, reduce_scatter inputs
  ReduceOp reduce = ReduceOp::kSum;
  int peer = -1;  // root, destination or source
  int tag = 0;
  // Whether the reduce op takes part (the fingerprints compare it too).
  bool uses_reduce() const {
    return kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter;
  }
  const char* name() const { return detail::op_kind_name(kind); }
};

}  // namespace ember::dist

namespace ember::dist::detail {

using Request = CollectiveRequest;

// Every check a request needs whatever the backend, for a group of `size` where this
// process is `rank`; throws ember::Error naming the operation and the offending value.
// Inline: on the path of every small collective.
inline void check_request(const Request& r, int rank, int size) {
  const char* op = r.name();
  if (r.tensor != nullptr) check_tensor(op, *r.tensor);
  switch (r.kind) {
    case OpKind::kAllreduce:
      check_reduce_op(op, *r.tensor, r.reduce);
      break;
    case OpKind::kBroadcast:
      check_root(op, r.peer, size);
      break;
    case OpKind::kReduce:
      check_root(op, r.peer, size);
      check_reduce_op(op, *r.tensor, r.reduce);
      break;
    case OpKind::kAllgather:
      check_list(op, "outputs", *r.list, *r.tensor, size);
      break;
    case OpKind::kReduceScatter:
      check_list(op, "inputs", *r.list, *r.tensor, size);
      check_reduce_op(op, *r.tensor, r.reduce);
      break;
    case OpKind::kBarrier:
      break;
    case OpKind::kSend:
    case OpKind::kRecv:
      check_peer(op, r.peer, rank, size);
      EMBER_CHECK(r.tag >= 0, op, "tag must be non-negative, got ", r.tag);
      break;
  }
}

// "[0, 2]": a group's members as the job numbers them, for messages.
std::string ranks_str(const std::vector<int>& ranks);

// What new_group() gives a rank outside `global_ranks`: a group of their size whose rank()
// is -1 and whose every operation throws ember::Error saying that this rank is no member.
std::shared_ptr<ProcessGroup> make_non_member_group(const ProcessGroup& parent,
                                                    std::vector<int> global_ranks);

}  // namespace ember::dist::detail

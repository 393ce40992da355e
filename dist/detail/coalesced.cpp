#include "coalesced.h"

#include <algorithm>

#include <ember/tensor/grad_mode.h>

#include <ember/dist/join.h>

namespace ember::dist::detail {

void broadcast_coalesced(ProcessGroup& group, const std::vector<Tensor>& tensors, int root,
                         size_t piece_bytes, JoinChannel* join) {
  NoGradGuard no_grad;
  // Kinds in order of first appearance: every rank issues the pieces in the same order.
  std::vector<std::vector<Tensor>> by_kind;
  for (const Tensor& t : tensors) {
    auto same_kind = [&](const std::vector<Tensor>& kind) {
      return kind.front().dtype() == t.dtype() && kind.front().device() == t.device();
    };
    auto it = std::find_if(by_kind.begin(), by_kind.end(), same_kind);
    if (it == by_kind.end()) it = by_kind.insert(by_kind.end(), std::vector<Tensor>{});
    it->push_back(t.detach());
  }
  for (const std::vector<Tensor>& members : by_kind) {
    // The pieces: members [first, last) and their element count, each at most piece_bytes
    // unless one member alone is larger.
    struct Piece {
      size_t first, last;
      int64_t numel;
    };
    std::vector<Piece> pieces;
    int64_t largest = 0;
    for (size_t first = 0; first < members.size();) {
      size_t last = first;
      int64_t numel = 0;
      do {
        numel += members[last++].numel();
      } while (last < members.size() &&
               static_cast<size_t>((numel + members[last].numel()) *
                                   members[last].element_size()) <= piece_bytes);
      pieces.push_back({first, last, numel});
      largest = std::max(largest, numel);
      first = last;
    }
    const Tensor buffer = empty({largest}, members.front().options());
    for (const auto& [first, last, numel] : pieces) {
      const Tensor flat = buffer.narrow(0, 0, numel);
      auto slot = [&](int64_t at, const Tensor& t) {
        return flat.narrow(0, at, t.numel()).view(t.sizes());
      };
      const bool sending = group.rank() == root;
      // Copies between each member and its place in `flat`: into it on the root, else out.
      auto exchange = [&](bool into_flat) {
        int64_t at = 0;
        for (size_t i = first; i < last; ++i) {
          Tensor place = slot(at, members[i]);
          if (into_flat) {
            place.copy_(members[i]);
          } else {
            Tensor(members[i]).copy_(place);
          }
          at += members[i].numel();
        }
      };
      if (sending) exchange(true);
      if (join != nullptr) join->announce(JoinChannel::Op::kBroadcast, flat, root);
      group.broadcast(flat, root)->wait();
      if (!sending) exchange(false);
    }
  }
}

}  // namespace ember::dist::detail

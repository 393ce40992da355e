#include "common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <type_traits>

#include <ember/dist/flight_recorder.h>
#include <ember/tensor/detail/dispatch.h>

#include "flight.h"

namespace ember::dist::detail {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
  }
  return "?";
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

bool debug_from_env() {
  const char* value = std::getenv("EMBER_DIST_DEBUG");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

void report_bad_tensor(const char* op, const Tensor& t) {
  EMBER_CHECK(t.defined(), op, "tensor is undefined");
  throw Error(ember::detail::str_cat(op, ": tensor must be contiguous (shape ",
                                     shape_str(t.sizes()), ", strides ", shape_str(t.strides()),
                                     ")"));
}

void check_root(const char* op, int root, int size) {
  EMBER_CHECK(root >= 0 && root < size, op, "root ", root, " is not a rank of a group of ", size);
}

void check_peer(const char* op, int peer, int rank, int size) {
  EMBER_CHECK(size > 1 || peer == rank, op, "the single-process group has no rank ", peer,
              " to exchange with (a group of one rank)");
  EMBER_CHECK(peer >= 0 && peer < size, op, "peer ", peer, " is not a rank of a group of ", size);
  EMBER_CHECK(peer != rank, op, "rank ", rank, " cannot exchange with itself");
}

void report_bad_reduce_op(const char* op, const Tensor& t) {
  throw Error(
      ember::detail::str_cat(op, ": ReduceOp avg needs a floating-point tensor, got ", t.dtype()));
}

void check_list(const char* op, const char* what, const std::vector<Tensor>& list,
                const Tensor& like, int size) {
  EMBER_CHECK(static_cast<int>(list.size()) == size, op, what, " holds ", list.size(),
              " tensors but the group has ", size, " ranks");
  for (size_t r = 0; r < list.size(); ++r) {
    const Tensor& t = list[r];
    EMBER_CHECK(t.defined(), op, what, "[", r, "] is undefined");
    EMBER_CHECK(
        t.sizes() == like.sizes() && t.dtype() == like.dtype() && t.device() == like.device(), op,
        what, "[", r, "] is ", t.dtype(), " ", shape_str(t.sizes()), " on ", t.device(), " but ",
        like.dtype(), " ", shape_str(like.sizes()), " on ", like.device(), " was expected");
    EMBER_CHECK(t.is_contiguous(), op, what, "[", r, "] must be contiguous");
  }
}

Fingerprint Fingerprint::of(OpKind kind, int64_t seq, const Tensor* t, int root, int reduce) {
  Fingerprint f;
  f.kind = static_cast<int32_t>(kind);
  f.seq = seq;
  f.root = root;
  f.reduce = reduce;
  if (t != nullptr) {
    f.dtype = static_cast<int32_t>(t->dtype());
    f.numel = t->numel();
    f.ndim = static_cast<int32_t>(t->dim());
    uint64_t hash = 1469598103934665603ull;  // FNV-1a over the sizes
    for (int64_t d = 0; d < t->dim(); ++d) {
      const auto size = static_cast<uint64_t>(t->size(d));
      if (d < kMaxDims) f.dims[static_cast<size_t>(d)] = t->size(d);
      hash = (hash ^ size) * 1099511628211ull;
    }
    f.shape_hash = hash;
  }
  return f;
}

Fingerprint Fingerprint::goodbye(int64_t issued, int32_t last_kind) {
  Fingerprint f;
  f.kind = kGoodbye;
  f.seq = issued + 1;
  f.last_kind = issued > 0 ? last_kind : -1;
  return f;
}

bool Fingerprint::operator==(const Fingerprint& o) const {
  return kind == o.kind && reduce == o.reduce && root == o.root && dtype == o.dtype &&
         seq == o.seq && numel == o.numel && ndim == o.ndim && dims == o.dims &&
         shape_hash == o.shape_hash && last_kind == o.last_kind;
}

namespace {

// An OpKind read from another rank: named when valid.
std::string kind_str(int32_t kind) {
  if (kind < 0 || kind > static_cast<int32_t>(OpKind::kRecv)) return "kind " + std::to_string(kind);
  return op_kind_name(static_cast<OpKind>(kind));
}

// "rank 2" or "ranks 0, 1".
std::string ranks_named(const std::vector<size_t>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i > 0 ? ", " : "") << ranks[i];
  return out.str();
}

// The ranks of `all` grouped by equal fingerprint, in order of their first rank.
std::vector<std::vector<size_t>> classes_of(const std::vector<Fingerprint>& all) {
  std::vector<std::vector<size_t>> classes;
  for (size_t r = 0; r < all.size(); ++r) {
    auto same = std::find_if(classes.begin(), classes.end(),
                             [&](const std::vector<size_t>& c) { return all[c[0]] == all[r]; });
    if (same == classes.end()) {
      classes.push_back({r});
    } else {
      same->push_back(r);
    }
  }
  return classes;
}

}  // namespace

std::string Fingerprint::str() const {
  std::ostringstream out;
  if (is_goodbye()) {
    if (last_kind < 0) return "left the group before any collective";
    out << "left the group after " << kind_str(last_kind) << " #" << seq - 1;
    return out.str();
  }
  out << kind_str(kind) << " #" << seq;
  if (dtype >= 0 && dtype < kNumDTypes) {
    out << " on " << static_cast<DType>(dtype) << " [";
    for (int d = 0; d < std::min(ndim, kMaxDims + 1); ++d) {
      if (d > 0) out << ", ";
      if (d == kMaxDims) {
        out << "...";
        break;
      }
      out << dims[static_cast<size_t>(d)];
    }
    out << "]";
  }
  if (reduce >= 0) out << " (" << reduce_op_name(static_cast<ReduceOp>(reduce)) << ")";
  if (root >= 0) out << " (root " << root << ")";
  return out.str();
}

void check_fingerprints(const std::string& op, const std::vector<Fingerprint>& all, int rank,
                        bool issued) {
  const std::vector<std::vector<size_t>> classes = classes_of(all);
  if (classes.size() <= 1) return;
  std::vector<size_t> left;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].is_goodbye()) left.push_back(r);
  std::ostringstream out;
  out << op << " on rank " << rank << ": ";
  if (!left.empty()) {
    for (const auto& c : classes) {
      if (!all[c[0]].is_goodbye()) continue;
      out << ranks_named(c) << " " << all[c[0]].str() << " (destroy_process_group, the group's "
          << "destruction or the process's exit), ";
    }
    out << "while ";
    bool first = true;
    for (const auto& c : classes) {
      if (all[c[0]].is_goodbye()) continue;
      out << (first ? "" : " and ") << ranks_named(c) << " waited in " << all[c[0]].str();
      first = false;
    }
    out << "; the group cannot be used any more";
    throw Error(out.str());
  }
  out << "the ranks issued different collectives: ";
  for (size_t i = 0; i < classes.size(); ++i) {
    out << (i > 0 ? "; " : "") << ranks_named(classes[i]) << " issued " << all[classes[i][0]].str();
  }
  out << ". Every rank must issue the same collectives, in the same order, with the same "
         "shapes and dtypes; "
      << (issued ? "every rank had issued it already, so the group cannot be used any more"
                 : "every rank skipped this one and the group can still be used");
  if (issued) throw Error(out.str());  // the caller breaks the group, which dumps the records
  // The group stays usable, so no break dumps the records: this does, on every rank.
  if (flight_recorder_enabled()) dump_flight_records(out.str());
  throw FingerprintMismatch(out.str());
}

std::chrono::milliseconds checked_timeout(const char* group, std::chrono::milliseconds timeout) {
  EMBER_CHECK(timeout.count() > 0, group, "timeout must be positive, got ", timeout.count(), " ms");
  return std::min(timeout, kLongestTimeout);
}

void report_broken_group(const std::string& backend, int rank, const std::string& message) {
  std::fprintf(stderr, "ember::dist: the %s process group broke on rank %d: %s\n", backend.c_str(),
               rank, message.c_str());
  std::fflush(stderr);
}

std::string timeout_message(const std::string& what, int rank, std::chrono::milliseconds limit,
                            const std::string& backend, int size) {
  std::ostringstream out;
  const bool point_to_point = what.starts_with("send") || what.starts_with("recv");
  out << what << " on rank " << rank << " timed out after " << limit.count() << " ms (" << backend
      << " group of " << size << " ranks): "
      << (point_to_point ? "the peer died or never issued the matching send or recv"
                         : "another rank died, hangs outside any collective or never issued this "
                           "one")
      << "; the group cannot be used any more";
  return out.str();
}

std::string op_name(OpKind kind, int64_t seq) {
  return std::string(op_kind_name(kind)) + " #" + std::to_string(seq);
}

void divide_in_place(void* data, int64_t count, DType dtype, int divisor) {
  ember::detail::dispatch_floating(dtype, "divide_in_place", [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Elements widen to float (double stays double); float divides in float, the 16-bit
    // floats and double in double.
    using Wide = std::conditional_t<std::is_same_v<T, double>, double, float>;
    using Math = std::conditional_t<std::is_same_v<T, float>, float, double>;
    auto* p = static_cast<T*>(data);
    const auto d = static_cast<Math>(divisor);
    for (int64_t i = 0; i < count; ++i) {
      p[i] = static_cast<T>(static_cast<Math>(static_cast<Wide>(p[i])) / d);
    }
  });
}

}  // namespace ember::dist::detail

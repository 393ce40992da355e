// Shared by the process groups: argument checks, names for error messages, the fingerprint
// that debug mode exchanges before each collective, and the completion and numbering of the
// operations the MPI and TCP backends queue.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <ember/dist/process_group.h>

namespace ember::dist::detail {

enum class OpKind : int32_t {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduce,
  kReduceScatter,
  kBarrier,
  kSend,
  kRecv
};
const char* op_kind_name(OpKind kind);
std::string op_name(OpKind kind, int64_t seq);  // "allreduce #17"
const char* reduce_op_name(ReduceOp op);
inline bool is_collective(OpKind kind) { return kind != OpKind::kSend && kind != OpKind::kRecv; }

// True when EMBER_DIST_DEBUG is set to something other than "" or "0".
bool debug_from_env();

// Argument checks shared by every backend; each throws ember::Error naming the operation.
// The two every collective makes test inline and report out of line: a small all-reduce's
// whole cost is overhead like theirs.
[[noreturn]] void report_bad_tensor(const char* op, const Tensor& t);
inline void check_tensor(const char* op, const Tensor& t) {
  if (!t.defined() || !t.is_contiguous()) [[unlikely]]
    report_bad_tensor(op, t);
}
void check_root(const char* op, int root, int size);
void check_peer(const char* op, int peer, int rank, int size);
[[noreturn]] void report_bad_reduce_op(const char* op, const Tensor& t);
inline void check_reduce_op(const char* op, const Tensor& t, ReduceOp reduce) {
  if (reduce == ReduceOp::kAvg && !t.is_floating_point()) [[unlikely]]
    report_bad_reduce_op(op, t);
}
// `list` must hold `size` tensors shaped, typed and placed like `like`.
void check_list(const char* op, const char* what, const std::vector<Tensor>& list,
                const Tensor& like, int size);

// What debug mode compares across ranks: the collective, its sequence number, and the
// dtype, shape (first kMaxDims dims, plus a hash of all), root and reduce op.
struct Fingerprint {
  static constexpr int kMaxDims = 6;
  int32_t kind = 0;
  int32_t reduce = -1;
  int32_t root = -1;
  int32_t dtype = -1;
  int64_t seq = 0;
  int64_t numel = 0;
  int32_t ndim = 0;
  int32_t padding = 0;
  std::array<int64_t, kMaxDims> dims{};
  uint64_t shape_hash = 0;

  static Fingerprint of(OpKind kind, int64_t seq, const Tensor* t, int root, int reduce);
  bool operator==(const Fingerprint& other) const;
  std::string str() const;  // "allreduce #3 on f32 [4, 4] (sum)"
};
// The error debug mode reports on every rank when fingerprints differ, or "" when they agree.
std::string compare_fingerprints(const std::vector<Fingerprint>& all, int rank);
// Thrown for such a mismatch: every rank sees it and skips the collective, so, unlike any
// other failure of an issued operation, it leaves the group in step and usable.
struct FingerprintMismatch : Error {
  using Error::Error;
};

// A group's timeout, checked (positive) and capped at 30 days, so a "never" value such as
// milliseconds::max() cannot overflow the deadlines computed from it.
inline constexpr std::chrono::milliseconds kLongestTimeout = std::chrono::hours(24 * 30);
std::chrono::milliseconds checked_timeout(const char* group, std::chrono::milliseconds timeout);
// The limit of one wait: `requested` (capped likewise) when positive, else the group's.
inline std::chrono::milliseconds wait_limit(std::chrono::milliseconds requested,
                                            std::chrono::milliseconds group_timeout) {
  return requested.count() > 0 ? std::min(requested, kLongestTimeout) : group_timeout;
}

// Writes why a group broke to stderr (flushed): "ember::dist: the mpi process group broke on
// rank 1: <message>". Each backend calls it once per group, when the group breaks, so the
// reason is on record even when the process ends before the caller reports the ember::Error
// (the MPI backend's destructor ends the job with MPI_Abort, possibly while the exception
// unwinds; a launcher stops the other ranks once one fails). Nothing is written otherwise.
void report_broken_group(const std::string& backend, int rank, const std::string& message);

// "allreduce #17 on rank 1 timed out after 5000 ms (...)".
std::string timeout_message(const std::string& what, int rank, std::chrono::milliseconds limit,
                            const std::string& backend, int size);

// The completion a queued operation's Work shares across backends: the thread that runs it
// calls complete() once, with its failure or nothing; waiters block until then. Completion
// takes no lock unless somebody sleeps on it: a waiter that runs its op itself never does.
// complete() still touches the op after waiters may return, so its caller must hold a
// reference to the op (a queue entry or a WorkHandle), never a bare pointer.
class CompletionWork : public Work {
 public:
  // "allreduce #17": what errors call it. Built on demand, off the fast path.
  virtual std::string name() const = 0;

  void complete(const std::string& error = {}) {
    // Pending -> done in one step on success; a failure is written under `kFailing` first.
    int pending = kPending;
    if (error.empty()) {
      if (!state_.compare_exchange_strong(pending, kDone)) return;  // the first outcome stands
    } else {
      if (!state_.compare_exchange_strong(pending, kFailing)) return;
      error_ = error;
      state_.store(kDone);  // publishes error_
    }
    wake_sleepers();
  }

  bool is_completed() override { return done(); }
  // Somebody already sleeps on it: offering it to a waiter (offer_to_waiter) would be wasted.
  bool has_sleepers() const { return sleepers_.load(std::memory_order_relaxed) > 0; }

 protected:
  // A backend may complete a successful op without complete(), by publishing its end some
  // other way (the MPI group: its count of finished collectives), which saves complete()'s
  // atomic exchange; this then says whether it did. That publication must be a seq_cst atomic
  // read-modify-write followed by wake_sleepers(), as complete() orders its own.
  virtual bool completed_elsewhere() const { return false; }
  // After the completion is published: the sleepers' count is read after that store, as a
  // sleeper raises the count before it checks.
  void wake_sleepers() {
    if (sleepers_.load() != 0) notify_sleepers();
  }

  // Back to pending, for an op being reused: only when nobody else holds it.
  void reset_completion() {
    state_.store(kPending, std::memory_order_relaxed);
    error_.clear();
  }

  // Blocks until complete() and throws the failure it recorded. After `limit` it throws
  // timeout_message(name, ...) instead, once `break_group(message)` has run: the group
  // cannot be trusted after a collective timed out.
  template <typename BreakGroup>
  void wait_completed(std::chrono::milliseconds limit, int rank, int size, const char* backend,
                      BreakGroup&& break_group) {
    if (!done()) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1);  // ordered before the check of the state in the wait
      const bool finished = cv_.wait_for(lock, limit, [&] { return done(); });
      sleepers_.fetch_sub(1);
      if (!finished) {
        lock.unlock();
        const std::string message = timeout_message(name(), rank, limit, backend, size);
        break_group(message);
        throw Error(message);
      }
    }
    if (!error_.empty()) throw Error(error_);
  }

 private:
  void notify_sleepers();  // out of line: rare, and off the fast path's cache lines
  std::mutex mutex_;
  std::condition_variable cv_;
  enum : int { kPending, kFailing, kDone };
  // Completed, by complete() or elsewhere (completed_elsewhere: then without a failure).
  bool done() const { return state_.load() == kDone || completed_elsewhere(); }
  std::atomic<int> state_{kPending};  // error_ is final once it is kDone
  std::atomic<int> sleepers_{0};
  std::string error_;
};

// What the MPI and TCP backends queue for their communication threads (as ScheduledOp,
// detail/scheduler.h, which resets every field listed here when it reuses an op).
struct QueuedOp : CompletionWork {
  explicit QueuedOp(OpKind k) : kind(k) {}
  std::string name() const override;
  OpKind kind;
  int64_t seq = 0;  // among the group's collectives, or among its sends and recvs
  ReduceOp reduce = ReduceOp::kSum;
  int peer = -1;  // root, destination or source
  int tag = 0;
  Tensor tensor;             // the one tensor (allgather: input; reduce_scatter: output)
  std::vector<Tensor> list;  // allgather outputs, reduce_scatter inputs
  Fingerprint fingerprint;   // debug mode only

  // A waiter may run a lone collective itself (detail::Scheduler's inline fast path): the
  // collective thread offers it once, and the waiter that takes it marks it claimed.
  bool offered = false;              // guarded by the group's mutex
  std::atomic<bool> claimed{false};  // read by the offering thread without the lock
};

// How long a communication thread leaves a lone new collective for its waiter to claim; one
// nobody waits on yet starts this much later.
inline constexpr auto kClaimWindow = std::chrono::microseconds(50);

// Offers `op` to its waiter: unlocks `lock`, spins (yielding) until the waiter claims it or
// kClaimWindow passes, then locks again. Spinning, not a timed sleep: a timer waking the
// thread in the middle of the waiter's collective costs more than the spin.
void offer_to_waiter(std::unique_lock<std::mutex>& lock, QueuedOp& op);

// The group's op counters; every rank numbers its ops alike, so the numbers name them.
struct OpCounters {
  int64_t collectives = 0, p2p = 0;
};

// Under the group's lock, before `op` is queued: numbers it (which names it), refuses it
// (ember::Error) when the group broke earlier (`broken_message`), and in debug mode fills its
// fingerprint (with the reduce op when `uses_reduce`).
void refuse_or_fingerprint(QueuedOp& op, int rank, bool broken, const std::string& broken_message,
                           bool uses_reduce);
inline void stamp_op(QueuedOp& op, OpCounters& counters, int rank, bool broken,
                     const std::string& broken_message, bool debug, bool uses_reduce) {
  op.seq = is_collective(op.kind) ? ++counters.collectives : ++counters.p2p;
  if (broken || debug) refuse_or_fingerprint(op, rank, broken, broken_message, uses_reduce);
}

// Divides `count` elements at `data` of a floating dtype by `divisor` in place (kAvg).
void divide_in_place(void* data, int64_t count, DType dtype, int divisor);

}  // namespace ember::dist::detail

// The one scheduler of the queued backends (MPI, TCP): the queue, the collective thread, the
// send/recv thread and its ordering rule, the inline fast path, spinning before sleeping,
// timeouts, the group's broken state and its messages, and shutdown. A backend supplies only
// its transport (detail::Transport): how an operation starts, progresses and fails.
//
// Issue order: collectives run one after another in issue order, on the collective thread or
// on a waiter's own thread (the inline fast path: a waiter whose collective is next and not
// taken yet runs it itself, saving two thread hand-offs, which dominate small collectives).
// Sends and receives run on the send/recv thread, each starting once every collective issued
// before it has finished, concurrently with later collectives. A blocking transport call run
// inline cannot time out by itself: the collective thread watches it and hands one still
// running a second after its limit to Transport::abort_hung (MPI ends the job).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "engine.h"
#include "flight.h"

namespace ember::dist::detail {

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
  Fingerprint fingerprint;   // collectives: what the ranks compare before running it

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
  OpKind last_collective = OpKind::kBarrier;  // the kind of collective #collectives
};

// Under the group's lock, before `op` is queued: refuses it (ember::Error) when the group
// broke earlier (`broken_message`), and fills a collective's fingerprint (with the reduce op
// when `uses_reduce`), which every rank compares before it runs it.
void refuse_or_fingerprint(QueuedOp& op, int rank, bool broken, const std::string& broken_message,
                           bool uses_reduce);
inline void stamp_op(QueuedOp& op, OpCounters& counters, int rank, bool broken,
                     const std::string& broken_message, bool uses_reduce) {
  const bool collective = is_collective(op.kind);
  op.seq = collective ? ++counters.collectives : ++counters.p2p;
  if (collective) counters.last_collective = op.kind;
  if (broken || collective) refuse_or_fingerprint(op, rank, broken, broken_message, uses_reduce);
}

// Whether a group can still be used. Any failure of an issued operation but a fingerprint
// mismatch (which every rank sees) breaks it for good: the reason is recorded, written to
// stderr once (report_broken_group), and every later operation is refused with it.
class GroupHealth {
 public:
  // `backend` names the group in messages ("mpi", "tcp"); it must outlive the health.
  void init(const char* backend, int rank, int size) {
    backend_ = backend;
    rank_ = rank;
    size_ = size;
  }
  bool broken() const { return broken_.load(); }
  const char* backend() const { return backend_; }
  // Why it broke. Read only once broken() is true: it is written before the flag is raised.
  const std::string& reason() const { return reason_; }

  // Records `message` as the reason and reports it, unless the group broke already; true
  // when this call broke it. Callers serialise it (the group's mutex).
  bool mark_broken(const std::string& message) {
    if (broken_.load()) return false;
    reason_ = message;
    broken_.store(true);
    report_broken_group(backend_, rank_, message);
    return true;
  }
  // The same without the report, for a process about to end with its own message.
  void mark_broken_quietly(const std::string& message) {
    reason_ = message;
    broken_.store(true);
  }

  // "allreduce #17 on rank 1 timed out after 5000 ms (mpi group of 2 ranks): ...".
  std::string timeout_message(const std::string& what, std::chrono::milliseconds limit) const {
    return detail::timeout_message(what, rank_, limit, backend_, size_);
  }

  // The failure `e` of an issued operation as its waiter gets it. Unless every rank skips the
  // operation (a fingerprint mismatch), it breaks the group first, through `break_group`.
  template <typename BreakGroup>
  static std::string failure_of(const std::exception& e, BreakGroup&& break_group) {
    if (dynamic_cast<const FingerprintMismatch*>(&e) == nullptr) break_group(e.what());
    return e.what();
  }

 private:
  std::atomic<bool> broken_{false};
  std::string reason_;
  const char* backend_ = "";
  int rank_ = 0, size_ = 1;
};

class Scheduler;

// An operation as the scheduler queues it; a backend derives its own, with its transport's
// fields, and resets them in recycle_transport() (ops are reused: see Scheduler::enqueue).
struct ScheduledOp : QueuedOp, std::enable_shared_from_this<ScheduledOp> {
  ScheduledOp(std::shared_ptr<Scheduler> s, OpKind k) : QueuedOp(k), sched(std::move(s)) {}
  std::shared_ptr<Scheduler> sched;  // shares ownership of the backend's state
  int64_t after = 0;                 // send/recv: starts once this many collectives finished
  std::chrono::steady_clock::time_point started;  // by whichever thread runs it

  // Who runs a collective: the collective thread, or its waiter (claim_for_inline_run).
  // kClaiming: a waiter won it and is about to publish its limit (a few instructions).
  enum Runner : int { kUnclaimed, kThread, kClaiming, kWaiter };
  std::atomic<int> runner{kUnclaimed};
  std::atomic<int64_t> inline_limit_ms{0};  // a waiter's limit, for the watchdog

  // Kept short, with the rarer paths out of line: between two small collectives the program
  // runs other code, so this path usually starts from a cold instruction cache.
  void wait(std::chrono::milliseconds timeout) override;
  // A collective its waiter ran without failing is complete once counted finished: they
  // finish in order, and every other outcome calls complete() first. Read only through a
  // handle, so `seq` is this op's (it is reused only when nobody holds one).
  bool completed_elsewhere() const override;

  // Every field back to its initial value but the group's, for reuse as a new `k`.
  void recycle(OpKind k);
  void release_tensors() {
    if (tensor.defined()) tensor = Tensor();
    if (!list.empty()) list.clear();
    release_transport_buffers();
  }

 protected:
  friend class Scheduler;
  virtual void recycle_transport() {}          // the derived op's fields
  virtual void release_transport_buffers() {}  // its staging buffers
 private:
  bool claim_for_inline_run(std::chrono::milliseconds limit);
  void run_inline(std::chrono::milliseconds limit);  // throws its failure
  [[noreturn, gnu::cold]] void fail_inline_run(const std::exception& e);
  [[gnu::noinline]] void wait_for_completion(std::chrono::milliseconds limit);
};

// What a backend supplies: its transport. Every call but wake_p2p and abort_hung comes from
// the scheduler's threads or an inline waiter, one operation at a time per collective.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::shared_ptr<ScheduledOp> make_op(OpKind kind) = 0;
  // For an op whose tensor is not on the CPU, at issue (MPI: the event that orders its
  // staging after the caller's stream).
  virtual void attach_device(ScheduledOp& /*op*/) {}
  // Before the scheduler's own threads start an op (MPI: they take its tensor's device).
  virtual void on_thread_start(ScheduledOp& /*op*/) {}

  // A collective: start() begins it (it may run to the end: a blocking call), progress() takes
  // one step and says whether it finished. Both throw its failure.
  virtual void start(ScheduledOp& op) = 0;
  virtual bool progress(ScheduledOp& op) = 0;
  // A collective on its waiter's thread, to the end within `limit`; the default starts it and
  // polls progress().
  virtual void run_blocking(ScheduledOp& op, std::chrono::milliseconds limit);

  // Sends and receives: p2p_start() begins one; p2p_poll() moves every started one (it may
  // block a short while when `idle` says none is started); p2p_done() says whether one
  // finished. p2p_start and p2p_poll throw a failure, which breaks the group.
  virtual void p2p_start(ScheduledOp& op) = 0;
  virtual void p2p_poll(bool idle) = 0;
  virtual bool p2p_done(ScheduledOp& op) = 0;
  // Whether p2p_poll must run even with nothing started (TCP reads messages nobody asked for
  // yet); the send/recv thread then never sleeps elsewhere, and wake_p2p() must end its wait.
  virtual bool p2p_polls_when_idle() const { return false; }
  virtual void wake_p2p() {}
  // After a break: forget every started send and recv (they have been failed).
  virtual void p2p_abandon() {}

  // Whether a failed op's buffers may still be used by the transport (an MPI request
  // pending): the scheduler then keeps the op for good instead of releasing them.
  virtual bool still_in_use(const ScheduledOp& /*op*/) const { return false; }
  // The group broke (under the scheduler's lock): stop the transport (TCP shuts its
  // connections so peers fail at once; MPI marks the job broken).
  virtual void on_broken() {}
  // A blocking call that outlived its limit plus a grace and cannot be interrupted: `message`
  // says which. The default breaks the group, which a transport that stops on a break ends.
  virtual void abort_hung(const std::string& message);
  // The group broke and this rank dumped its flight records: ask the peers to dump theirs
  // too, the hung one included (TCP: through the store). Outside the scheduler's lock.
  virtual void request_peer_dumps() {}

  Scheduler* scheduler = nullptr;  // set by the scheduler
};

class Scheduler {
 public:
  // For member `rank` of a group whose members are the job's `global_ranks`, this process
  // being the job's `global_rank`.
  Scheduler(Transport& transport, const char* backend, int rank,
            const std::vector<int>& global_ranks, int global_rank,
            const ProcessGroupOptions& options);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // The threads; `self` is the shared pointer ops keep (aliasing the backend's state).
  void start_threads(const std::shared_ptr<Scheduler>& self);
  // What a new op keeps (Transport::make_op): it shares ownership of the backend's state.
  std::shared_ptr<Scheduler> shared_self() const { return self_.lock(); }
  // Numbers, refuses or queues a checked request; returns its Work.
  WorkHandle enqueue(const Request& request);
  // Breaks the group with `message` (once; later calls do nothing) and fails what is queued.
  void break_group(const std::string& message);
  // The destructor's first half: stops taking work and waits, bounded, for the threads to
  // finish what was issued (see there); then join().
  void stop_and_wait();
  void join();
  // Broken without the report, for a transport about to end the process with its own.
  void mark_broken_quietly(const std::string& message) { health_.mark_broken_quietly(message); }

  const GroupHealth& health() const { return health_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  const ProcessGroupOptions& options() const { return options_; }
  // Collectives finished so far (in issue order).
  int64_t collectives_finished() const { return collectives_finished_.load(); }
  // What this rank sends its peers when it leaves the group (see Fingerprint::goodbye).
  Fingerprint goodbye();

 private:
  friend struct ScheduledOp;
  using OpPtr = std::shared_ptr<ScheduledOp>;
  enum class SpinResult { kNone, kWork, kWorkPastItsWindow };

  void run();
  void run_p2p();
  SpinResult spin_for_work(std::unique_lock<std::mutex>& lock);
  void run_on_thread(const OpPtr& op);
  void collective_finished() {
    collectives_finished_.fetch_add(1);
    const bool wake_thread = thread_awaits_collective_.load();
    const bool wake_p2p = p2p_awaits_collective_.load();
    if (wake_thread || wake_p2p) wake_for_finished(wake_thread, wake_p2p);
  }
  [[gnu::noinline]] void wake_for_finished(bool wake_thread, bool wake_p2p);
  void wake_p2p();
  void fail_queued();  // under the lock, once broken
  void release_buffers(ScheduledOp& op, bool failed);
  [[gnu::noinline]] void renew_spare(OpKind kind, int64_t finished);
  [[gnu::noinline]] void attach_rare_args(ScheduledOp& op, const Request& r);
  std::string failure_of(const std::exception& e) {
    return GroupHealth::failure_of(e, [this](const std::string& m) { break_group(m); });
  }
  void count_thread_out();

  Transport& transport_;
  const int rank_, size_;
  ProcessGroupOptions options_;
  GroupHealth health_;
  FlightRecorder recorder_;  // this group's last collectives, for the dumps

  std::mutex mutex_;
  std::condition_variable cv_;      // wakes the collective thread
  std::condition_variable p2p_cv_;  // wakes the send/recv thread
  // Collectives the thread has not taken, in issue order; those their waiters ran stay until
  // enqueue drops them (once finished) or a break fails the rest.
  std::deque<OpPtr> queue_;
  std::deque<OpPtr> p2p_queue_;  // sends and receives, in issue order
  // Collectives finished so far. They finish in issue order, one at a time, on the collective
  // thread or on a waiter's, which counts its own without the lock. A thread that sleeps
  // until this count grows raises its flag first (under the lock), and collective_finished()
  // wakes it: each side writes its own variable, then reads the other's.
  alignas(64) std::atomic<int64_t> collectives_finished_{0};
  // The collectives issued and accepted, for the collective thread's spin (spin_for_work).
  std::atomic<int64_t> collectives_issued_{0};
  alignas(64) std::atomic<bool> thread_awaits_collective_{false};  // later ones held back
  std::atomic<bool> p2p_awaits_collective_{false};  // a send or receive waits for one
  // The collective thread sleeps until new work comes (under the mutex): enqueue wakes it
  // only then, and clears it.
  bool thread_sleeps_for_work_ = false;
  // The op issued last, reused for the next one once nobody else holds it: making a new one
  // is much of a small collective's cost.
  OpPtr spare_;
  // Ops abandoned after a failure while the transport may still use their buffers: never
  // freed or reused. Under the mutex.
  std::vector<OpPtr> abandoned_;
  bool stop_ = false;
  int threads_ended_ = 0;
  std::condition_variable threads_cv_;
  int64_t running_seq_ = 0;  // the collective the collective thread runs now (0: none)
  OpKind running_kind_ = OpKind::kAllreduce;
  OpCounters counters_;
  std::thread thread_, p2p_thread_;
  std::weak_ptr<Scheduler> self_;
};

}  // namespace ember::dist::detail

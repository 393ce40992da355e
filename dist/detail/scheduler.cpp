#include "scheduler.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>

#include <ember/tensor/grad_mode.h>

namespace ember::dist::detail {

using Clock = std::chrono::steady_clock;

namespace {

// The collective thread watches a collective its waiter runs and hands one that outlives
// the waiter's limit by this much to Transport::abort_hung.
constexpr auto kWatchdogGrace = std::chrono::seconds(1);

// How long the collective thread spins (yielding) before it sleeps for new work. A collective
// issued to a sleeping thread wakes it, a futex call in the issuing thread that costs
// microseconds where the thread's core went idle (6-30 us on this project's VM): more than a
// small all-reduce. Collectives closer together than this need no wake. A stream of them
// keeps it spinning up to kSpinLimit, then it sleeps: the cost of a wake now and then, not a
// core spent for as long as small collectives keep coming.
constexpr auto kSpinBeforeSleep = std::chrono::microseconds(200);
constexpr auto kSpinLimit = std::chrono::milliseconds(2);

}  // namespace

// --- completion and numbering ----------------------------------------------------------------

// A sleeper holds the mutex from its check until it sleeps: taking it here means the
// notification cannot fall between the two.
void CompletionWork::notify_sleepers() {
  { std::lock_guard<std::mutex> lock(mutex_); }
  cv_.notify_all();
}

void offer_to_waiter(std::unique_lock<std::mutex>& lock, QueuedOp& op) {
  op.offered = true;
  const auto until = std::chrono::steady_clock::now() + kClaimWindow;
  lock.unlock();
  while (!op.claimed.load(std::memory_order_relaxed) && std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  lock.lock();
}

std::string QueuedOp::name() const { return op_name(kind, seq); }

void refuse_or_fingerprint(QueuedOp& op, int rank, bool broken, const std::string& broken_message,
                           bool uses_reduce) {
  EMBER_CHECK(!broken, op.name(), "rank ", rank,
              ": the process group cannot be used after an earlier failure: ", broken_message);
  const bool rooted = op.kind == OpKind::kBroadcast || op.kind == OpKind::kReduce;
  op.fingerprint =
      Fingerprint::of(op.kind, op.seq, op.tensor.defined() ? &op.tensor : nullptr,
                      rooted ? op.peer : -1, uses_reduce ? static_cast<int>(op.reduce) : -1);
}

// --- the transport's defaults ----------------------------------------------------------------

void Transport::run_blocking(ScheduledOp& op, std::chrono::milliseconds limit) {
  op.started = Clock::now();
  start(op);
  while (!progress(op)) {
    if (Clock::now() - op.started > limit) {
      const std::string failure = scheduler->health().timeout_message(op.name(), limit);
      scheduler->break_group(failure);
      throw Error(failure);
    }
    std::this_thread::yield();
  }
}

void Transport::abort_hung(const std::string& message) { scheduler->break_group(message); }

// --- ops -------------------------------------------------------------------------------------

void ScheduledOp::recycle(OpKind k) {
  reset_completion();
  kind = k;
  seq = 0;
  reduce = ReduceOp::kSum;
  peer = -1;
  tag = 0;
  offered = false;
  claimed.store(false, std::memory_order_relaxed);
  release_tensors();
  after = 0;
  started = {};
  runner.store(kUnclaimed, std::memory_order_relaxed);
  inline_limit_ms.store(0, std::memory_order_relaxed);
  recycle_transport();
}

void ScheduledOp::wait(std::chrono::milliseconds timeout) {
  const auto limit = wait_limit(timeout, sched->options_.timeout);
  if (claim_for_inline_run(limit)) {
    run_inline(limit);
  } else {
    wait_for_completion(limit);
  }
}

bool ScheduledOp::completed_elsewhere() const {
  return seq != 0 && is_collective(kind) && sched->collectives_finished_.load() >= seq;
}

// A waiter runs its collective itself when every earlier one has finished and the collective
// thread has not started it: that saves two thread hand-offs, which dominate small ones.
bool ScheduledOp::claim_for_inline_run(std::chrono::milliseconds limit) {
  if (!is_collective(kind)) return false;  // a later send/recv may be its partner
  if (runner.load(std::memory_order_relaxed) != kUnclaimed) return false;
  // With every earlier collective finished none is in flight, and no later one starts before
  // this one finishes: the collective thread takes them in order. `broken` is read after the
  // count: a group breaks before the collective that broke it is counted.
  if (sched->collectives_finished_.load() != seq - 1 || sched->health_.broken()) return false;
  int unclaimed = kUnclaimed;
  if (!runner.compare_exchange_strong(unclaimed, kClaiming)) return false;
  inline_limit_ms.store(limit.count(), std::memory_order_relaxed);
  runner.store(kWaiter, std::memory_order_release);  // publishes the limit to the watchdog
  claimed.store(true, std::memory_order_relaxed);    // ends the thread's offer_to_waiter
  return true;
}

void ScheduledOp::run_inline(std::chrono::milliseconds limit) {
  Scheduler& s = *sched;
  try {
    // A break between the claim's check and its win (fail_queued left the op to it).
    if (s.health_.broken()) throw Error(s.health_.reason());
    s.recorder_.started(seq);
    s.transport_.run_blocking(*this, limit);
  } catch (const std::exception& e) {
    fail_inline_run(e);
  }
  s.recorder_.ended(seq, /*failed=*/false);
  // A success leaves nothing pending: its buffers go at once.
  release_tensors();
  s.collective_finished();  // this completes it (completed_elsewhere)
  wake_sleepers();
}

// An inline run's failure: it breaks the group (unless every rank skips it), completes the op
// with it, counts it finished and throws it to the waiter.
void ScheduledOp::fail_inline_run(const std::exception& e) {
  Scheduler& s = *sched;
  const std::string failure = s.failure_of(e);
  s.recorder_.ended(seq, /*failed=*/true);
  s.release_buffers(*this, true);
  complete(failure);
  s.collective_finished();
  throw Error(failure);
}

void ScheduledOp::wait_for_completion(std::chrono::milliseconds limit) {
  Scheduler& s = *sched;
  wait_completed(limit, s.rank_, s.size_, s.health_.backend(),
                 [&s](const std::string& message) { s.break_group(message); });
}

// --- the scheduler ---------------------------------------------------------------------------

Scheduler::Scheduler(Transport& transport, const char* backend, int rank,
                     const std::vector<int>& global_ranks, int global_rank,
                     const ProcessGroupOptions& options)
    : transport_(transport),
      rank_(rank),
      size_(static_cast<int>(global_ranks.size())),
      options_(options),
      recorder_(backend, rank, global_ranks, global_rank) {
  health_.init(backend, rank, size_);
  transport_.scheduler = this;
}

void Scheduler::start_threads(const std::shared_ptr<Scheduler>& self) {
  self_ = self;
  thread_ = std::thread([this] { run(); });
  p2p_thread_ = std::thread([this] { run_p2p(); });
}

void Scheduler::break_group(const std::string& message) {
  bool broke = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (health_.mark_broken(message)) {
      broke = true;
      transport_.on_broken();
      fail_queued();  // now, even while the collective thread is stuck in the transport
    }
  }
  cv_.notify_all();
  wake_p2p();
  if (broke && recorder_.on()) {
    recorder_.set_broken(message);
    dump_flight_records(std::string("the ") + health_.backend() + " group broke on rank " +
                        std::to_string(rank_) + ": " + message);
    transport_.request_peer_dumps();
  }
}

void Scheduler::wake_p2p() {
  p2p_cv_.notify_all();
  transport_.wake_p2p();
}

// A sleeper holds the lock from raising its flag until it sleeps: taking it here means the
// notification cannot fall in between. Out of line: rare, and off the fast path.
void Scheduler::wake_for_finished(bool wake_thread, bool wake_p2p_thread) {
  { std::lock_guard<std::mutex> lock(mutex_); }
  if (wake_thread) cv_.notify_all();
  if (wake_p2p_thread) wake_p2p();
}

// Once `op` ran: its tensors go (the op may outlive its run, queued or as the spare), unless
// it failed while the transport may still use them, which keeps them with the group.
void Scheduler::release_buffers(ScheduledOp& op, bool failed) {
  if (!failed || !transport_.still_in_use(op)) {
    op.release_tensors();
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  abandoned_.push_back(op.shared_from_this());
}

// Under the lock, once the group broke: queued collectives fail with its message. One its
// waiter runs stays, for the watchdog.
void Scheduler::fail_queued() {
  const int64_t finished = collectives_finished_.load();
  std::deque<OpPtr> running;
  for (auto& op : queue_) {
    int unclaimed = ScheduledOp::kUnclaimed;
    if (op->runner.compare_exchange_strong(unclaimed, ScheduledOp::kThread)) {
      recorder_.ended(op->seq, /*failed=*/true);
      op->complete(health_.reason());
    } else if (op->seq > finished) {
      running.push_back(op);
    }
  }
  queue_.swap(running);
}

void Scheduler::count_thread_out() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++threads_ended_;
  }
  threads_cv_.notify_all();
}

// Under the lock, when the spare cannot be reused where it stands (see enqueue): collectives
// their waiters ran to the end leave the queue here, on the issuing thread, and a spare that
// somebody else still holds, or none at all, gives way to a new op.
void Scheduler::renew_spare(OpKind kind, int64_t finished) {
  while (!queue_.empty() && queue_.front()->seq <= finished) queue_.pop_front();
  // Reused only when nobody else holds it: whoever dropped it last is done with it. (In a
  // broken group it may hold buffers the transport still uses, and stamp_op refuses anyway.)
  if (!spare_ || health_.broken() || spare_.use_count() != 1) spare_ = transport_.make_op(kind);
}

// What only some ops carry: the tensor list, and the transport's due for a device tensor.
void Scheduler::attach_rare_args(ScheduledOp& op, const Request& r) {
  if (r.list != nullptr) op.list = *r.list;
  if (op.tensor.defined() && !op.tensor.is_cpu()) transport_.attach_device(op);
}

// Kept short, with the rarer paths out of line, for the reason ScheduledOp::wait gives.
WorkHandle Scheduler::enqueue(const Request& r) {
  const bool collective = is_collective(r.kind);
  bool wake = false;
  WorkHandle handle;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t finished = collectives_finished_.load();
    // The commonest case, a collective after one its waiter ran: the spare is alone in the
    // queue, finished, held by the queue and `spare_` only. It is reused where it stands,
    // without a reference changing hands.
    const bool queued = collective && spare_ && !health_.broken() && queue_.size() == 1 &&
                        queue_.front() == spare_ && spare_->seq <= finished &&
                        spare_.use_count() == 2;
    if (!queued) renew_spare(r.kind, finished);
    ScheduledOp* const op = spare_.get();  // reused or new
    // After the use_count read (here or in renew_spare): whoever dropped it is done with it.
    std::atomic_thread_fence(std::memory_order_acquire);
    op->recycle(r.kind);
    try {
      if (r.tensor != nullptr) op->tensor = *r.tensor;
      op->reduce = r.reduce;
      op->peer = r.peer;
      op->tag = r.tag;
      if (r.list != nullptr || (op->tensor.defined() && !op->tensor.is_cpu())) {
        attach_rare_args(*op, r);
      }
      stamp_op(*op, counters_, rank_, health_.broken(), health_.reason(), r.uses_reduce());
    } catch (...) {
      op->release_tensors();  // refused: the spare keeps no tensor of the caller's
      op->seq = 0;            // left in the queue, it counts as finished
      throw;
    }
    if (collective) {
      recorder_.enqueued(op->fingerprint);
      if (!queued) queue_.push_back(spare_);
      collectives_issued_.store(counters_.collectives, std::memory_order_release);
      // NOTE: sent after the unlock, so a woken thread does not block on the mutex at once.
      // Another issuer that finds no sleeper meanwhile relies on this wake: its collective
      // may start only once this thread sends it (it is never lost).
      wake = std::exchange(thread_sleeps_for_work_, false);
    } else {
      op->after = counters_.collectives;  // issued before it: they finish first
      p2p_queue_.push_back(spare_);
      wake = true;
    }
    handle = spare_;
  }
  if (wake) {
    if (collective) {
      cv_.notify_all();
    } else {
      wake_p2p();
    }
  }
  return handle;
}

// Unlocks `lock` and spins (yielding the core to any thread that wants it) until a collective
// issued after those it saw needs this thread, kSpinBeforeSleep passes without any issued, or
// the group breaks; relocks. A lone new collective that finishes within kClaimWindow (its
// waiter ran it) needs nothing: the spin goes on, reading only the two counters, so the
// issuing thread keeps its cache lines. One still unfinished then is nobody's yet, which the
// thread starts at once (its claim window has passed), or a waiter's long run, to watch.
Scheduler::SpinResult Scheduler::spin_for_work(std::unique_lock<std::mutex>& lock) {
  int64_t seen = collectives_issued_.load();
  lock.unlock();
  const auto start = Clock::now();
  auto until = start + kSpinBeforeSleep;
  SpinResult result = SpinResult::kNone;
  while (result == SpinResult::kNone && !health_.broken()) {
    const int64_t issued = collectives_issued_.load(std::memory_order_acquire);
    if (issued != seen) {
      // A lone new one gets its claim window.
      const auto window_end = Clock::now() + kClaimWindow;
      int64_t finished = collectives_finished_.load();
      while (finished == issued - 1 && Clock::now() < window_end) {
        std::this_thread::yield();
        finished = collectives_finished_.load();
      }
      if (finished < issued - 1) {  // one is held back behind a run: the thread's business
        result = SpinResult::kWork;
      } else if (finished < issued) {
        result = SpinResult::kWorkPastItsWindow;
      } else {
        seen = issued;  // its waiter ran it: spin on, within kSpinLimit
        until = std::min(Clock::now() + kSpinBeforeSleep, start + kSpinLimit);
      }
    } else if (Clock::now() >= until) {
      break;
    } else {
      std::this_thread::yield();
    }
  }
  lock.lock();
  return result;
}

// The collective thread: takes collectives in issue order, offers a lone new one to its
// waiter first, watches those waiters run, and runs the rest.
void Scheduler::run() {
  GradMode::set_enabled(false);  // staging copies are not part of any graph
  struct Watch {                 // the collective a waiter runs, as the watchdog dates it
    int64_t seq = 0;
    OpKind kind = OpKind::kAllreduce;
    std::chrono::milliseconds limit{0};
    Clock::time_point deadline;
  } watch;
  bool spun = false;           // spun since it last slept or took work: sleeps at once next time
  bool window_passed = false;  // the spin gave new collectives their claim window already
  std::unique_lock<std::mutex> lock(mutex_);
  // Before it sleeps for work; it then looks at the queue again, under the lock.
  auto spin = [&] {
    const SpinResult found = spin_for_work(lock);
    window_passed = found == SpinResult::kWorkPastItsWindow;
    spun = found == SpinResult::kNone;
  };
  for (;;) {
    const bool claim_window_passed = std::exchange(window_passed, false);
    if (health_.broken()) fail_queued();
    // Collectives finish in order: those up to collectives_finished_ are done (their waiters
    // ran them; enqueue drops them), the first one after it is next.
    const int64_t finished = collectives_finished_.load();
    size_t next = 0;
    while (next < queue_.size() && queue_[next]->seq <= finished) ++next;
    if (next == queue_.size()) {
      if (stop_) break;
      if (!spun) {
        spin();
        continue;
      }
      spun = false;
      thread_sleeps_for_work_ = true;
      cv_.wait(lock);
      thread_sleeps_for_work_ = false;
      continue;
    }
    // Not held across the waits below: a reference kept there would stop enqueue reusing it.
    ScheduledOp* const next_op = queue_[next].get();
    const int runner = next_op->runner.load();
    if (runner == ScheduledOp::kClaiming) {  // its limit is a few instructions away
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    if (runner == ScheduledOp::kWaiter) {
      // Its waiter runs it: watch it, and hold later collectives back until it finishes.
      if (watch.seq != next_op->seq) {
        const std::chrono::milliseconds limit(next_op->inline_limit_ms.load());
        watch = {next_op->seq, next_op->kind, limit, Clock::now() + limit + kWatchdogGrace};
      }
      if (collectives_finished_.load() < watch.seq && Clock::now() >= watch.deadline) {
        const std::string message =
            health_.timeout_message(op_name(watch.kind, watch.seq), watch.limit);
        lock.unlock();
        transport_.abort_hung(message);
        lock.lock();
        watch.deadline = Clock::now() + kWatchdogGrace;  // once per grace at most
        continue;
      }
      const bool held_back = next + 1 < queue_.size();
      if (held_back || stop_) {  // woken when it finishes (or, holding others back, on a break)
        thread_awaits_collective_.store(true);  // see collectives_finished_
        cv_.wait_until(lock, watch.deadline, [&] {
          return collectives_finished_.load() >= watch.seq || (held_back && health_.broken());
        });
        thread_awaits_collective_.store(false);
      } else if (!spun) {
        spin();
        continue;
      } else {
        spun = false;
        thread_sleeps_for_work_ = true;  // new work wakes it, not the run's end
        cv_.wait_until(lock, watch.deadline);
        thread_sleeps_for_work_ = false;
      }
      continue;  // (the deadline is checked above)
    }
    if (!stop_ && next + 1 == queue_.size() && !next_op->offered && !next_op->has_sleepers() &&
        !claim_window_passed) {
      // A caller that waits at once runs it faster itself (claim_for_inline_run).
      const OpPtr offered = queue_[next];  // kept through the unlocked offer
      spun = false;
      offer_to_waiter(lock, *offered);
      continue;
    }
    int unclaimed = ScheduledOp::kUnclaimed;
    if (!next_op->runner.compare_exchange_strong(unclaimed, ScheduledOp::kThread)) continue;
    spun = false;
    const OpPtr op = queue_[next];
    queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(next) + 1);
    running_seq_ = op->seq;
    running_kind_ = op->kind;
    lock.unlock();
    run_on_thread(op);
    lock.lock();
    running_seq_ = 0;
  }
  queue_.clear();
  lock.unlock();
  count_thread_out();
}

void Scheduler::run_on_thread(const OpPtr& op) {
  std::string failure;
  try {
    // A break since it was taken (fail_queued found it taken): the transport is not used.
    if (health_.broken()) throw Error(health_.reason());
    op->started = Clock::now();
    recorder_.started(op->seq);
    transport_.on_thread_start(*op);
    transport_.start(*op);  // a blocking collective runs in here
    while (!transport_.progress(*op)) {
      if (health_.broken()) {        // another op failed: this one is abandoned too
        failure = health_.reason();  // written before `broken` was set
        break;
      }
      if (Clock::now() - op->started > options_.timeout) {
        failure = health_.timeout_message(op->name(), options_.timeout);
        break_group(failure);
        break;
      }
      std::this_thread::yield();
    }
  } catch (const std::exception& e) {
    failure = failure_of(e);
  }
  release_buffers(*op, !failure.empty());
  recorder_.ended(op->seq, !failure.empty());
  op->complete(failure);
  collective_finished();
}

// Sends and receives on a thread of their own, so their completion is seen even while the
// collective thread sits in a blocking collective.
void Scheduler::run_p2p() {
  GradMode::set_enabled(false);
  const bool polls_when_idle = transport_.p2p_polls_when_idle();
  std::vector<OpPtr> active;
  for (;;) {
    std::vector<OpPtr> fresh;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      auto startable = [&] {
        return !p2p_queue_.empty() && p2p_queue_.front()->after <= collectives_finished_.load();
      };
      if (active.empty() && !polls_when_idle) {
        p2p_cv_.wait(lock, [&] {
          p2p_awaits_collective_.store(!p2p_queue_.empty());  // see collectives_finished_
          return (stop_ && p2p_queue_.empty()) || startable() ||
                 (health_.broken() && !p2p_queue_.empty());
        });
      } else {
        p2p_awaits_collective_.store(!p2p_queue_.empty());  // before the count is read
      }
      while (startable()) {
        fresh.push_back(p2p_queue_.front());
        p2p_queue_.pop_front();
      }
      if (fresh.empty() && p2p_queue_.empty()) p2p_awaits_collective_.store(false);
      if (stop_ && p2p_queue_.empty() && active.empty() && fresh.empty()) break;
      if (health_.broken()) {
        const std::string& message = health_.reason();
        for (auto& op : active) {  // abandoned while the transport may still use them
          if (transport_.still_in_use(*op)) abandoned_.push_back(op);
          op->complete(message);
        }
        for (auto& op : fresh) op->complete(message);
        for (auto& op : p2p_queue_) op->complete(message);
        active.clear();
        fresh.clear();
        p2p_queue_.clear();
        lock.unlock();
        transport_.p2p_abandon();
        if (!polls_when_idle) continue;  // sleeps until stopped (or new ops fail at once)
      }
    }
    for (auto& op : fresh) {
      if (health_.broken()) {  // a start below broke it: a broken group never uses it again
        op->complete(health_.reason());
        continue;
      }
      try {
        op->started = Clock::now();
        active.push_back(op);
        transport_.on_thread_start(*op);
        transport_.p2p_start(*op);
      } catch (const std::exception& e) {
        active.pop_back();
        const std::string failure = failure_of(e);
        release_buffers(*op, true);
        op->complete(failure);
      }
    }
    // A broken group never uses the transport again, but one polling when idle waits there.
    if (health_.broken() && !polls_when_idle) continue;
    // Those done (also those that finished in the last poll) complete before the next poll,
    // which may block a while.
    const auto now = Clock::now();
    for (auto it = active.begin(); it != active.end();) {
      ScheduledOp& op = **it;
      bool finished = false;
      std::string failure;
      try {
        finished = transport_.p2p_done(op);
      } catch (const std::exception& e) {
        failure = failure_of(e);
        finished = true;
      }
      if (!finished && now - op.started > options_.timeout) {
        failure = health_.timeout_message(op.name(), options_.timeout);
        break_group(failure);
        finished = true;
      }
      if (finished) {
        release_buffers(op, !failure.empty());
        op.complete(failure);
        it = active.erase(it);
      } else {
        ++it;
      }
    }
    try {
      transport_.p2p_poll(active.empty());
    } catch (const std::exception& e) {
      failure_of(e);  // the break fails them all
    }
  }
  count_thread_out();
}

// Until the threads finished what was issued and ended, or the group broke. A blocking
// collective nobody waited on may never return when a peer died or skipped it: rather than
// hang the program's exit in a join, one that finishes nothing for the group's timeout (plus
// the watchdog's grace), counted from here or the last collective that finished, goes to
// Transport::abort_hung, as an uncaught timeout would.
void Scheduler::stop_and_wait() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    spare_.reset();  // it holds the state: a cycle otherwise
  }
  cv_.notify_all();
  wake_p2p();
  std::unique_lock<std::mutex> lock(mutex_);
  int64_t seen = -1;
  Clock::time_point deadline;
  while (threads_ended_ < 2 && !health_.broken()) {
    const int64_t finished = collectives_finished_.load();
    if (finished != seen) {
      seen = finished;
      deadline = Clock::now() + options_.timeout + kWatchdogGrace;
    }
    if (running_seq_ != 0 && Clock::now() >= deadline) {
      const std::string message =
          health_.timeout_message(op_name(running_kind_, running_seq_), options_.timeout);
      lock.unlock();
      transport_.abort_hung(message);
      lock.lock();
      continue;
    }
    // Progress does not notify threads_cv_: look again now and then.
    threads_cv_.wait_for(lock, std::chrono::milliseconds(100));
  }
}

Fingerprint Scheduler::goodbye() {
  std::lock_guard<std::mutex> lock(mutex_);
  return Fingerprint::goodbye(counters_.collectives,
                              static_cast<int32_t>(counters_.last_collective));
}

void Scheduler::join() {
  if (thread_.joinable()) thread_.join();
  if (p2p_thread_.joinable()) p2p_thread_.join();
}

}  // namespace ember::dist::detail

#include "mpi_process_group.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <ember/tensor/cuda.h>
#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

#include "detail/common.h"
#include "detail/engine.h"
#include "detail/mpi_runtime.h"
#include "detail/scheduler.h"

namespace ember::dist {

using detail::check_mpi;
using detail::Fingerprint;
using detail::MpiLock;
using detail::OpKind;
using Clock = std::chrono::steady_clock;

namespace {

struct Op;

// What the collective thread's spin before it sleeps found (State::spin_for_work).
enum class SpinResult {
  kNone,              // nothing issued that needs the thread: it may sleep
  kWork,              // collectives for the thread (held back behind another, or after a wait)
  kWorkPastItsWindow  // a lone new collective nobody claimed within kClaimWindow: start it
};

}  // namespace

struct MpiProcessGroup::State {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1, local_rank = 0;
  std::vector<int> global_ranks;  // the job's ranks of the members
  int global_rank = 0;
  ProcessGroupOptions options;
  bool debug = false;
  const detail::MpiTypeTable mpi_types;  // made after MPI is initialised (make_state)

  std::mutex mutex;
  std::condition_variable cv;      // wakes the collective thread
  std::condition_variable p2p_cv;  // wakes the send/recv thread
  // Collectives the thread has not taken, in issue order; those their waiters ran stay until
  // enqueue drops them (once finished) or a break fails the rest.
  std::deque<std::shared_ptr<Op>> queue;
  std::deque<std::shared_ptr<Op>> p2p_queue;  // sends and receives, in issue order
  // Collectives finished so far. They finish in issue order, one at a time, on the collective
  // thread or on a waiter's (inline, see the header), which counts its own without the lock.
  // A thread that sleeps until this count grows raises its flag first (under the lock), and
  // collective_finished() wakes it: each side writes its own variable, then reads the other's.
  alignas(64) std::atomic<int64_t> collectives_finished{0};
  // The collectives issued and accepted, published for the collective thread's spin before
  // it sleeps (spin_for_work). On one cache line with collectives_finished, of their own: the
  // spin reads nothing else.
  std::atomic<int64_t> collectives_issued{0};
  alignas(64) std::atomic<bool> thread_awaits_collective{false};  // later ones held back
  std::atomic<bool> p2p_awaits_collective{false};                 // a send or receive waits for one
  // The collective thread sleeps until new work comes (under mutex): enqueue wakes it only
  // then, and clears it. A wake already pending, or a thread still awake, sees the new op
  // anyway: it looks at the queue under the mutex before it sleeps again. (On a busy machine
  // a woken thread may wait long for a core, and every broadcast meanwhile would be wasted.)
  bool thread_sleeps_for_work = false;

  // The op issued last, reused for the next one once nobody else holds it: making a new one
  // (allocation, construction, reference counts) is much of a small collective's cost.
  std::shared_ptr<Op> spare;
  // Operations abandoned after a failure with an MPI request pending: MPI may still use their
  // buffers (tensors, staging copies, the debug fingerprint), so they are never freed or
  // reused; their job ends soon after. Under mutex.
  std::vector<std::shared_ptr<Op>> abandoned;
  bool stop = false;
  // The threads count themselves out here as they end; the destructor waits on threads_cv.
  int threads_ended = 0;
  std::condition_variable threads_cv;
  // The collective the collective thread runs now (seq 0: none); under mutex.
  int64_t running_seq = 0;
  OpKind running_kind = OpKind::kAllreduce;
  detail::OpCounters counters;
  detail::GroupHealth health;
  std::thread thread;      // collectives
  std::thread p2p_thread;  // sends and receives

  void break_group(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (health.mark_broken(message)) {
        detail::mark_mpi_job_broken();
        fail_queued();  // now, even while the collective thread is stuck in MPI
      }
    }
    cv.notify_all();
    p2p_cv.notify_all();
  }
  void run();
  void run_p2p();
  SpinResult spin_for_work(std::unique_lock<std::mutex>& lock);
  // Counts a finished collective; called without the lock.
  void collective_finished() {
    collectives_finished.fetch_add(1);
    const bool wake_thread = thread_awaits_collective.load();
    const bool wake_p2p = p2p_awaits_collective.load();
    if (wake_thread || wake_p2p) wake_for_finished(wake_thread, wake_p2p);
  }
  // A sleeper holds the lock from raising its flag until it sleeps: taking it here means
  // the notification cannot fall in between. Out of line: rare, and off the fast path.
  [[gnu::noinline]] void wake_for_finished(bool wake_thread, bool wake_p2p) {
    { std::lock_guard<std::mutex> lock(mutex); }
    if (wake_thread) cv.notify_all();
    if (wake_p2p) p2p_cv.notify_all();
  }
  void fail_queued();
  void release_buffers(Op& op, bool failed);  // not under the lock
  void keep_buffers(Op& op);                  // under the lock
  // Reports a blocking collective that outlived `limit` and ends the job (it cannot be
  // interrupted): one a waiter runs, or one nobody waited on when the group is destroyed.
  [[noreturn]] void abort_hung_op(OpKind kind, int64_t seq, std::chrono::milliseconds limit);
  void wait_for_threads();  // the destructor's, bounded: see there
  void count_thread_out() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++threads_ended;
    }
    threads_cv.notify_all();
  }
};

namespace {

using State = MpiProcessGroup::State;

struct Op final : detail::QueuedOp, std::enable_shared_from_this<Op> {
  std::shared_ptr<State> state;
  std::unique_ptr<cuda::Event> ready;  // CUDA tensors: recorded on the caller's stream

  // Communication thread only.
  enum class Stage { kFingerprint, kMain } stage = Stage::kMain;
  std::vector<Fingerprint> gathered;
  MPI_Request request = MPI_REQUEST_NULL;
  Tensor host;        // what MPI reads and writes for `tensor`
  Tensor packed;      // allgather / reduce_scatter: [size * numel], unless `list` is one block
  int64_t after = 0;  // send/recv: starts once this many collectives have finished
  void* packed_data = nullptr;
  Clock::time_point started;  // set by whichever thread runs it, for its timeout

  // Who runs a collective: the collective thread, or its waiter (claim_for_inline_run).
  // kClaiming: a waiter won it and is about to publish its limit (a few instructions).
  enum Runner : int { kUnclaimed, kThread, kClaiming, kWaiter };
  std::atomic<int> runner{kUnclaimed};
  std::atomic<int64_t> inline_limit_ms{0};  // a waiter's limit, for the watchdog

  Op(std::shared_ptr<State> s, OpKind k) : QueuedOp(k), state(std::move(s)) {}

  // Every field back to its initial value but the group, for reuse as a new `k` (see
  // State::spare). A field added to Op or QueuedOp must be reset here too.
  void recycle(OpKind k) {
    reset_completion();
    kind = k;
    seq = 0;
    reduce = ReduceOp::kSum;
    peer = -1;
    tag = 0;
    offered = false;
    claimed.store(false, std::memory_order_relaxed);
    ready.reset();
    stage = Stage::kMain;
    if (state->debug) reset_debug_fields();
    request = MPI_REQUEST_NULL;
    release_tensors();
    after = 0;
    packed_data = nullptr;
    started = {};
    runner.store(kUnclaimed, std::memory_order_relaxed);
    inline_limit_ms.store(0, std::memory_order_relaxed);
  }
  void release_tensors() {  // see State::release_buffers
    if (tensor.defined()) tensor = Tensor();
    if (host.defined() || packed.defined() || !list.empty()) release_staging();
  }
  // Out of line, as the commonest collective, a CPU all-reduce, has none of these.
  [[gnu::noinline]] void release_staging() {
    host = Tensor();
    packed = Tensor();
    list.clear();
  }
  [[gnu::noinline]] void reset_debug_fields() {  // only debug mode fills these
    fingerprint = Fingerprint{};
    gathered.clear();
  }

  // Kept short, with the rarer paths out of line: between two small collectives the program
  // runs other code, so this path usually starts from a cold instruction cache, and each cache
  // line of code it spans costs more than its instructions.
  void wait(std::chrono::milliseconds timeout) override {
    const auto limit = detail::wait_limit(timeout, state->options.timeout);
    if (claim_for_inline_run(limit)) {
      run_inline(limit);
    } else {
      wait_for_completion(limit);
    }
  }

  // A collective its waiter ran without failing is complete once counted finished
  // (run_inline): they finish in order, and every other outcome calls complete() first.
  // Read only through a handle, so `seq` is this op's (it is reused only when nobody holds one).
  bool completed_elsewhere() const override {
    return seq != 0 && detail::is_collective(kind) && state->collectives_finished.load() >= seq;
  }

  bool claim_for_inline_run(std::chrono::milliseconds limit);
  void run_inline(std::chrono::milliseconds limit);         // throws its failure
  void run_inline_staged(std::chrono::milliseconds limit);  // throws its failure
  [[noreturn, gnu::cold]] void fail_inline_run(const std::exception& e);
  [[gnu::noinline]] void wait_for_completion(std::chrono::milliseconds limit);
};

[[noreturn, gnu::cold]] void report_mpi_failure(const State& s, const Op& op, int code) {
  check_mpi(code, op.name() + " on rank " + std::to_string(s.rank));
  std::abort();  // check_mpi threw: code is not MPI_SUCCESS
}

// The message is built only on failure: these checks sit on every collective's fast path.
void check_op(const State& s, const Op& op, int code) {
  if (code != MPI_SUCCESS) [[unlikely]]
    report_mpi_failure(s, op, code);
}

// The failure of an issued operation, as its waiter gets it. Unless every rank skips it (a
// debug-mode mismatch), it breaks the group first: see the NOTE (failure) in the header.
std::string failure_of(State& s, const std::exception& e) {
  return detail::GroupHealth::failure_of(e, [&s](const std::string& m) { s.break_group(m); });
}

// NOTE: Open MPI's all-reduce slows down about tenfold above 24 MiB on one node (measured
// with 2 ranks: 5 GB/s at 16 MiB, 0.5 GB/s at 32 MiB and beyond), so larger all-reduces
// are issued as consecutive calls over pieces of this size, which keep the fast rate.
constexpr int64_t kAllreducePieceBytes = int64_t{16} << 20;

// One communication stream per device for staging CUDA tensors, created on first use.
cuda::Stream staging_stream(int device) {
  static std::mutex mutex;
  static std::vector<cuda::Stream> streams;
  static std::vector<bool> made;
  std::lock_guard<std::mutex> lock(mutex);
  const auto d = static_cast<size_t>(device);
  if (streams.size() <= d) {
    streams.resize(d + 1);
    made.resize(d + 1, false);
  }
  if (!made[d]) {
    streams[d] = cuda::Stream::create(device, /*high_priority=*/true);
    made[d] = true;
  }
  return streams[d];
}

// For a scope: the staging stream of `device` current, with its device (so pinned buffers
// and copies make no context on another device). When it `copies` the op's tensors, it is
// ordered after the caller's work on them (the event recorded at issue) first: reads and
// writes alike, as a recv must not land in a tensor the caller's stream still uses.
struct Staging {
  Staging(const Op& op, int device, bool copies) : stream(staging_stream(device)), guard(stream) {
    if (copies && op.ready) op.ready->wait(stream);
  }
  cuda::Stream stream;
  cuda::StreamGuard guard;
};

// ember's own threads take the device of the CUDA tensors they stage as theirs, for good: a
// guard that restored such a thread's default device would make a context on device 0, in
// every rank whatever its GPU.
void adopt_device(const Op& op) {
  if (op.tensor.defined() && op.tensor.is_cuda()) cuda::set_device(op.tensor.device().index);
}

// The host buffer MPI uses for `t`: `t` itself on the CPU, else a pinned copy (filled from
// the device when `fill`).
Tensor stage_in(const Op& op, const Tensor& t, bool fill) {
  if (t.is_cpu()) return t;
  const Staging staging(op, t.device().index, /*copies=*/fill);
  Tensor pinned = empty(t.sizes(), TensorOptions(t.dtype()).with_pinned_memory());
  if (fill) pinned.copy_(t);  // blocking: done on return
  return pinned;
}

void stage_out(const Op& op, const Tensor& dst, const Tensor& host) {
  if (dst.is_same(host) || dst.is_cpu()) return;
  const Staging staging(op, dst.device().index, /*copies=*/true);
  Tensor(dst).copy_(host);  // blocking: the device holds the result once this returns
}

// True when the tensors of `list` lie one after another in host memory.
bool consecutive_on_host(const std::vector<Tensor>& list) {
  if (list.empty() || !list[0].is_cpu()) return false;
  const auto* base = static_cast<const char*>(list[0].data_ptr());
  for (size_t r = 0; r < list.size(); ++r) {
    if (static_cast<const char*>(list[r].data_ptr()) != base + r * list[0].nbytes()) return false;
  }
  return true;
}

void prepare_packed(Op& op, bool fill) {
  if (consecutive_on_host(op.list)) {
    op.packed_data = op.list[0].data_ptr();
    return;
  }
  const Tensor& like = op.list[0];
  const int64_t n = like.numel();
  std::optional<Staging> staging;
  if (like.is_cuda()) staging.emplace(op, like.device().index, /*copies=*/fill);
  op.packed = empty({static_cast<int64_t>(op.list.size()) * n},
                    TensorOptions(like.dtype()).with_pinned_memory(like.is_cuda()));
  op.packed_data = op.packed.data_ptr();
  if (!fill) return;
  for (size_t r = 0; r < op.list.size(); ++r) {
    Tensor slot = op.packed.narrow(0, static_cast<int64_t>(r) * n, n).view(like.sizes());
    if (like.is_cpu()) {
      std::memcpy(slot.data_ptr(), op.list[r].data_ptr(), like.nbytes());
    } else {
      slot.copy_(op.list[r]);  // blocking: done on return
    }
  }
}

void unpack(Op& op) {
  if (!op.packed.defined()) return;  // MPI wrote into the outputs directly
  const Tensor& like = op.list[0];
  const int64_t n = like.numel();
  for (size_t r = 0; r < op.list.size(); ++r) {
    Tensor slot = op.packed.narrow(0, static_cast<int64_t>(r) * n, n).view(like.sizes());
    if (like.is_cpu()) {
      std::memcpy(op.list[r].data_ptr(), slot.data_ptr(), like.nbytes());
    } else {
      stage_out(op, op.list[r], slot);
    }
  }
}

// NOTE: an all-reduce is always a blocking MPI_Allreduce (on whichever thread runs it): Open
// MPI's blocking algorithms are markedly faster than its non-blocking ones, and a rank must
// never pick one kind while a peer picks the other (MPI does not match a blocking collective
// with a non-blocking one), so the choice cannot depend on what else is in flight here. MPI's
// progress engine still moves this rank's pending sends and receives meanwhile, and the
// send/recv thread sees them complete. A peer that
// never joins leaves the thread blocked, but a waiter on another thread still times out and
// breaks the group, which then aborts the job on destruction rather than joining that thread.
// Every other collective is non-blocking and polled.
// The blocking all-reduce of `op.tensor`'s elements at `buf`, in pieces of at most
// kAllreducePieceBytes; the caller holds MpiLock.
int allreduce_in_pieces(const State& s, const Op& op, void* buf, detail::MpiTypeOp tp) {
  const auto esize = static_cast<int64_t>(op.tensor.element_size());
  const int64_t total = op.tensor.numel();
  if (total * esize <= kAllreducePieceBytes) {  // one piece: the commonest, kept short
    return MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(total), tp.type, tp.op, s.comm);
  }
  const int64_t piece = std::max<int64_t>(1, kAllreducePieceBytes / esize);
  int rc = MPI_SUCCESS;
  for (int64_t at = 0; at < total && rc == MPI_SUCCESS; at += piece) {
    rc = MPI_Allreduce(MPI_IN_PLACE, static_cast<char*>(buf) + at * esize,
                       static_cast<int>(std::min(piece, total - at)), tp.type, tp.op, s.comm);
  }
  return rc;
}

void start_main(State& s, Op& op) {
  op.stage = Op::Stage::kMain;
  const DType dtype = op.tensor.defined() ? op.tensor.dtype() : kU8;
  // Checked when it was issued (at most INT_MAX); all-reduces go in pieces.
  const int count = op.tensor.defined() && op.kind != OpKind::kAllreduce
                        ? static_cast<int>(op.tensor.numel())
                        : 0;
  void* buf = op.host.defined() ? op.host.data_ptr() : nullptr;
  const detail::MpiTypeOp tp = s.mpi_types(dtype, op.reduce);
  const MPI_Datatype type = tp.type;
  MpiLock lock;
  int rc = MPI_SUCCESS;
  switch (op.kind) {
    case OpKind::kAllreduce:
      rc = allreduce_in_pieces(s, op, buf, tp);
      op.request = MPI_REQUEST_NULL;  // MPI_Test reports it complete at once
      break;
    case OpKind::kBroadcast:
      rc = MPI_Ibcast(buf, count, type, op.peer, s.comm, &op.request);
      break;
    case OpKind::kReduce:
      rc = s.rank == op.peer
               ? MPI_Ireduce(MPI_IN_PLACE, buf, count, type, tp.op, op.peer, s.comm, &op.request)
               : MPI_Ireduce(buf, nullptr, count, type, tp.op, op.peer, s.comm, &op.request);
      break;
    case OpKind::kAllgather:
      rc = MPI_Iallgather(buf, count, type, op.packed_data, count, type, s.comm, &op.request);
      break;
    case OpKind::kReduceScatter:
      rc = MPI_Ireduce_scatter_block(op.packed_data, buf, count, type, tp.op, s.comm, &op.request);
      break;
    case OpKind::kBarrier:
      rc = MPI_Ibarrier(s.comm, &op.request);
      break;
    case OpKind::kSend:
      rc = MPI_Isend(buf, count, type, op.peer, op.tag, s.comm, &op.request);
      break;
    case OpKind::kRecv:
      rc = MPI_Irecv(buf, count, type, op.peer, op.tag, s.comm, &op.request);
      break;
  }
  check_op(s, op, rc);
}

void start(State& s, Op& op) {
  switch (op.kind) {
    case OpKind::kAllreduce:
    case OpKind::kReduce:
    case OpKind::kSend:
      op.host = stage_in(op, op.tensor, true);
      break;
    case OpKind::kBroadcast:
      op.host = stage_in(op, op.tensor, s.rank == op.peer);
      break;
    case OpKind::kRecv:
      op.host = stage_in(op, op.tensor, false);
      break;
    case OpKind::kAllgather:
      op.host = stage_in(op, op.tensor, true);
      prepare_packed(op, false);
      break;
    case OpKind::kReduceScatter:
      op.host = stage_in(op, op.tensor, false);
      prepare_packed(op, true);
      break;
    case OpKind::kBarrier:
      break;
  }
  if (s.debug && detail::is_collective(op.kind)) {
    op.stage = Op::Stage::kFingerprint;
    op.gathered.resize(static_cast<size_t>(s.size));
    MpiLock lock;
    check_mpi(MPI_Iallgather(&op.fingerprint, sizeof(Fingerprint), MPI_BYTE, op.gathered.data(),
                             sizeof(Fingerprint), MPI_BYTE, s.comm, &op.request),
              op.name() + " (debug check) on rank " + std::to_string(s.rank));
    return;
  }
  start_main(s, op);
}

void finish(State& s, Op& op) {
  const bool avg = op.reduce == ReduceOp::kAvg;
  switch (op.kind) {
    case OpKind::kAllreduce:
    case OpKind::kReduceScatter:
      if (avg)
        detail::divide_in_place(op.host.data_ptr(), op.host.numel(), op.host.dtype(), s.size);
      stage_out(op, op.tensor, op.host);
      break;
    case OpKind::kReduce:
      if (s.rank != op.peer) break;
      if (avg)
        detail::divide_in_place(op.host.data_ptr(), op.host.numel(), op.host.dtype(), s.size);
      stage_out(op, op.tensor, op.host);
      break;
    case OpKind::kBroadcast:
    case OpKind::kRecv:
      stage_out(op, op.tensor, op.host);
      break;
    case OpKind::kAllgather:
      unpack(op);
      break;
    case OpKind::kBarrier:
    case OpKind::kSend:
      break;
  }
}

// One step of progress; true once the op is finished.
bool advance(State& s, Op& op) {
  // A blocking all-reduce leaves no request: MPI_Test would only report it complete.
  int flag = op.request == MPI_REQUEST_NULL ? 1 : 0;
  if (!flag) {
    MpiLock lock;
    check_op(s, op, MPI_Test(&op.request, &flag, MPI_STATUS_IGNORE));
  }
  if (!flag) return false;
  if (op.stage == Op::Stage::kFingerprint) {
    const std::string mismatch = detail::compare_fingerprints(op.gathered, s.rank);
    if (!mismatch.empty()) throw detail::FingerprintMismatch(op.name() + ": " + mismatch);
    start_main(s, op);
    return false;
  }
  finish(s, op);
  return true;
}

// A waiter runs its collective itself when every earlier one has finished and the collective
// thread has not started it (see the NOTE in the header): that saves two thread hand-offs,
// which dominate small collectives. The collective thread watches such a run and ends the job
// when it outlives the waiter's limit by this much.
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

bool Op::claim_for_inline_run(std::chrono::milliseconds limit) {
  if (!detail::is_collective(kind)) return false;  // a later send/recv may be its partner
  if (runner.load(std::memory_order_relaxed) != kUnclaimed) return false;
  // With every earlier collective finished none is in flight, and no later one starts before
  // this one finishes: the collective thread takes them in order. `broken` is read after the
  // count: a group breaks before the collective that broke it is counted.
  if (state->collectives_finished.load() != seq - 1 || state->health.broken()) return false;
  int unclaimed = kUnclaimed;
  if (!runner.compare_exchange_strong(unclaimed, kClaiming)) return false;
  inline_limit_ms.store(limit.count(), std::memory_order_relaxed);
  runner.store(kWaiter, std::memory_order_release);  // publishes the limit to the watchdog
  claimed.store(true, std::memory_order_relaxed);    // ends the thread's offer_to_waiter
  return true;
}

void Op::run_inline(std::chrono::milliseconds limit) {
  try {
    // A break between the claim's check and its win (fail_queued left the op to it).
    if (state->health.broken()) throw Error(state->health.reason());
    if (kind == OpKind::kAllreduce && !state->debug && tensor.is_cpu()) {
      // The commonest collective, kept short (a waiter's small all-reduce is all overhead):
      // in place in the caller's tensor, with neither staging nor polling.
      void* data = tensor.data_ptr();
      {
        MpiLock lock;
        check_op(
            *state, *this,
            allreduce_in_pieces(*state, *this, data, state->mpi_types(tensor.dtype(), reduce)));
      }
      if (reduce == ReduceOp::kAvg) {
        detail::divide_in_place(data, tensor.numel(), tensor.dtype(), state->size);
      }
    } else {
      run_inline_staged(limit);
    }
  } catch (const std::exception& e) {
    fail_inline_run(e);
  }
  // A success leaves no request pending: its buffers go at once.
  release_tensors();
  state->collective_finished();  // this completes it (completed_elsewhere)
  wake_sleepers();
}

// An inline run's failure: it breaks the group (see failure_of), completes the op with it,
// counts it finished and throws it to the waiter.
void Op::fail_inline_run(const std::exception& e) {
  const std::string failure = failure_of(*state, e);
  state->release_buffers(*this, true);
  complete(failure);
  state->collective_finished();
  throw Error(failure);
}

void Op::wait_for_completion(std::chrono::milliseconds limit) {
  wait_completed(limit, state->rank, state->size, "mpi",
                 [this](const std::string& message) { state->break_group(message); });
}

void Op::run_inline_staged(std::chrono::milliseconds limit) {
  // Staging copies are not part of any graph; a CPU tensor needs none.
  std::optional<NoGradGuard> no_grad;
  if (!tensor.defined() || !tensor.is_cpu() || !list.empty()) no_grad.emplace();
  // A blocking all-reduce is done once start() returns (its hang is the watchdog's), so
  // only the others read the clock, before staging as the watchdog does.
  bool blocking = kind == OpKind::kAllreduce && !state->debug;
  if (!blocking) started = Clock::now();
  start(*state, *this);
  while (!advance(*state, *this)) {
    if (blocking) {  // not expected: then time it from here
      started = Clock::now();
      blocking = false;
    } else if (Clock::now() - started > limit) {
      const std::string failure = state->health.timeout_message(name(), limit);
      state->break_group(failure);
      throw Error(failure);
    }
    std::this_thread::yield();
  }
}

// A blocking MPI call run inline cannot be interrupted: when it outlives its deadline, the
// collective thread reports it and ends the job, as an uncaught timeout would.
void MpiProcessGroup::State::abort_hung_op(OpKind kind, int64_t seq,
                                           std::chrono::milliseconds limit) {
  const std::string message = health.timeout_message(detail::op_name(kind, seq), limit);
  health.mark_broken_quietly(message);
  detail::mark_mpi_job_broken();
  std::fprintf(stderr, "ember::Error: %s\n", message.c_str());
  detail::abort_mpi_job();
}

// Once `op` ran: its tensors go (the op may outlive its run, queued or as the spare), unless
// it failed with an MPI request still pending on them, which keeps them with the group.
void MpiProcessGroup::State::release_buffers(Op& op, bool failed) {
  if (!failed || op.request == MPI_REQUEST_NULL) {
    op.release_tensors();
    return;
  }
  std::lock_guard<std::mutex> lock(mutex);
  keep_buffers(op);
}

void MpiProcessGroup::State::keep_buffers(Op& op) { abandoned.push_back(op.shared_from_this()); }

// Under the lock, once the group broke: queued collectives fail with its message. One its
// waiter runs stays, for the watchdog.
void MpiProcessGroup::State::fail_queued() {
  // NOTE: abandoned requests stay with MPI: a broken group never calls MPI again.
  const int64_t finished = collectives_finished.load();
  std::deque<std::shared_ptr<Op>> running;
  for (auto& op : queue) {
    int unclaimed = Op::kUnclaimed;
    if (op->runner.compare_exchange_strong(unclaimed, Op::kThread)) {
      op->complete(health.reason());
    } else if (op->seq > finished) {
      running.push_back(op);
    }
  }
  queue.swap(running);
}

void MpiProcessGroup::State::run() {
  GradMode::set_enabled(false);  // staging copies are not part of any graph
  struct Watch {                 // the collective a waiter runs, as the watchdog dates it
    int64_t seq = 0;
    OpKind kind = OpKind::kAllreduce;
    std::chrono::milliseconds limit{0};
    Clock::time_point deadline;
  } watch;
  bool spun = false;           // spun since it last slept or took work: sleeps at once next time
  bool window_passed = false;  // the spin gave new collectives their claim window already
  std::unique_lock<std::mutex> lock(mutex);
  // Before it sleeps for work; it then looks at the queue again, under the lock.
  auto spin = [&] {
    const SpinResult found = spin_for_work(lock);
    window_passed = found == SpinResult::kWorkPastItsWindow;
    spun = found == SpinResult::kNone;
  };
  for (;;) {
    const bool claim_window_passed = std::exchange(window_passed, false);
    if (health.broken()) fail_queued();
    // Collectives finish in order: those up to collectives_finished are done (their waiters ran
    // them; enqueue drops them), the first one after it is next.
    const int64_t finished = collectives_finished.load();
    size_t next = 0;
    while (next < queue.size() && queue[next]->seq <= finished) ++next;
    if (next == queue.size()) {
      if (stop) break;
      if (!spun) {
        spin();
        continue;
      }
      spun = false;
      thread_sleeps_for_work = true;
      cv.wait(lock);
      thread_sleeps_for_work = false;
      continue;
    }
    // Not held across the waits below: a reference kept there would stop enqueue reusing it.
    Op* const next_op = queue[next].get();
    const int runner = next_op->runner.load();
    if (runner == Op::kClaiming) {  // its limit is a few instructions away
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      continue;
    }
    if (runner == Op::kWaiter) {
      // Its waiter runs it: watch it, and hold later collectives back until it finishes.
      if (watch.seq != next_op->seq) {
        const std::chrono::milliseconds limit(next_op->inline_limit_ms.load());
        watch = {next_op->seq, next_op->kind, limit, Clock::now() + limit + kWatchdogGrace};
      }
      if (collectives_finished.load() < watch.seq && Clock::now() >= watch.deadline) {
        abort_hung_op(watch.kind, watch.seq, watch.limit);
      }
      const bool held_back = next + 1 < queue.size();
      if (held_back || stop) {  // woken when it finishes (or, holding others back, on a break)
        thread_awaits_collective.store(true);  // see collectives_finished
        cv.wait_until(lock, watch.deadline, [&] {
          return collectives_finished.load() >= watch.seq || (held_back && health.broken());
        });
        thread_awaits_collective.store(false);
      } else if (!spun) {
        spin();
        continue;
      } else {
        spun = false;
        thread_sleeps_for_work = true;  // new work wakes it, not the run's end
        cv.wait_until(lock, watch.deadline);
        thread_sleeps_for_work = false;
      }
      continue;  // (the deadline is checked above)
    }
    if (!stop && next + 1 == queue.size() && !next_op->offered && !next_op->has_sleepers() &&
        !claim_window_passed) {
      // A caller that waits at once runs it faster itself (claim_for_inline_run).
      const std::shared_ptr<Op> offered = queue[next];  // kept through the unlocked offer
      spun = false;
      detail::offer_to_waiter(lock, *offered);
      continue;
    }
    int unclaimed = Op::kUnclaimed;
    if (!next_op->runner.compare_exchange_strong(unclaimed, Op::kThread)) continue;  // waiter's
    spun = false;
    const std::shared_ptr<Op> op = queue[next];
    queue.erase(queue.begin(), queue.begin() + static_cast<std::ptrdiff_t>(next) + 1);
    running_seq = op->seq;
    running_kind = op->kind;
    lock.unlock();
    std::string failure;
    try {
      // A break since the check above (fail_queued found it taken): no MPI call any more.
      if (health.broken()) throw Error(health.reason());
      op->started = Clock::now();
      adopt_device(*op);
      start(*this, *op);  // an all-reduce blocks in here
      while (!advance(*this, *op)) {
        if (health.broken()) {        // another collective timed out: this one is abandoned too
          failure = health.reason();  // written before `broken` was set
          break;
        }
        if (Clock::now() - op->started > options.timeout) {
          failure = health.timeout_message(op->name(), options.timeout);
          break_group(failure);
          break;
        }
        std::this_thread::yield();
      }
    } catch (const std::exception& e) {
      failure = failure_of(*this, e);
    }
    release_buffers(*op, !failure.empty());
    op->complete(failure);
    collective_finished();
    lock.lock();
    running_seq = 0;
  }
  queue.clear();
  lock.unlock();
  count_thread_out();
}

// Unlocks `lock` and spins (yielding the core to any thread that wants it) until a collective
// issued after those it saw needs this thread, kSpinBeforeSleep passes without any issued, or
// the group breaks; relocks. A lone new collective that finishes within kClaimWindow (its
// waiter ran it) needs nothing: the spin goes on, reading only the two counters, so the
// issuing thread keeps its cache lines. One still unfinished then is nobody's yet, which the
// thread starts at once (its claim window has passed), or a waiter's long run, to watch.
SpinResult MpiProcessGroup::State::spin_for_work(std::unique_lock<std::mutex>& lock) {
  int64_t seen = collectives_issued.load();
  lock.unlock();
  const auto start = Clock::now();
  auto until = start + kSpinBeforeSleep;
  SpinResult result = SpinResult::kNone;
  while (result == SpinResult::kNone && !health.broken()) {
    const int64_t issued = collectives_issued.load(std::memory_order_acquire);
    if (issued != seen) {
      // A lone new one gets its claim window.
      const auto window_end = Clock::now() + detail::kClaimWindow;
      int64_t finished = collectives_finished.load();
      while (finished == issued - 1 && Clock::now() < window_end) {
        std::this_thread::yield();
        finished = collectives_finished.load();
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

// Until the threads finished what was issued and ended, or the group broke. A blocking
// all-reduce nobody waited on never returns when a peer died or skipped it: rather than hang
// the program's exit in a join, the job ends when the collective thread is inside a
// collective and none finished for the group's timeout (plus the watchdog's grace), counted
// from the destructor's start or the last one that finished, as an uncaught timeout would.
void MpiProcessGroup::State::wait_for_threads() {
  std::unique_lock<std::mutex> lock(mutex);
  int64_t seen = -1;
  Clock::time_point deadline;
  while (threads_ended < 2 && !health.broken()) {
    const int64_t finished = collectives_finished.load();
    if (finished != seen) {
      seen = finished;
      deadline = Clock::now() + options.timeout + kWatchdogGrace;
    }
    if (running_seq != 0 && Clock::now() >= deadline) {
      abort_hung_op(running_kind, running_seq, options.timeout);
    }
    // Progress does not notify threads_cv: look again now and then.
    threads_cv.wait_for(lock, std::chrono::milliseconds(100));
  }
}

// Sends and receives on a thread of their own, so their completion is seen even while the
// communication thread sits in a blocking all-reduce.
void MpiProcessGroup::State::run_p2p() {
  GradMode::set_enabled(false);
  std::vector<std::shared_ptr<Op>> active;
  for (;;) {
    std::vector<std::shared_ptr<Op>> fresh;
    {
      std::unique_lock<std::mutex> lock(mutex);
      auto startable = [&] {
        return !p2p_queue.empty() && p2p_queue.front()->after <= collectives_finished.load();
      };
      if (active.empty()) {
        p2p_cv.wait(lock, [&] {
          p2p_awaits_collective.store(!p2p_queue.empty());  // see collectives_finished
          return (stop && p2p_queue.empty()) || startable() ||
                 (health.broken() && !p2p_queue.empty());
        });
        p2p_awaits_collective.store(false);
        if (stop && p2p_queue.empty()) break;
      }
      if (health.broken()) {
        const std::string message = health.reason();
        for (auto& op : active) {  // abandoned with their requests pending
          keep_buffers(*op);
          op->complete(message);
        }
        for (auto& op : p2p_queue) op->complete(message);
        active.clear();
        p2p_queue.clear();
        continue;
      }
      while (startable()) {
        fresh.push_back(p2p_queue.front());
        p2p_queue.pop_front();
      }
    }
    for (auto& op : fresh) {
      if (health.broken()) {  // a start below broke it: a broken group never calls MPI again
        op->complete(health.reason());
        continue;
      }
      try {
        op->started = Clock::now();
        adopt_device(*op);
        start(*this, *op);
        active.push_back(op);
      } catch (const std::exception& e) {
        const std::string failure = failure_of(*this, e);
        release_buffers(*op, true);
        op->complete(failure);
      }
    }
    for (auto it = active.begin(); it != active.end();) {
      Op& op = **it;
      bool finished = false;
      std::string failure;
      try {
        finished = advance(*this, op);
      } catch (const std::exception& e) {
        failure = failure_of(*this, e);
        finished = true;
      }
      if (!finished && Clock::now() - op.started > options.timeout) {
        failure = health.timeout_message(op.name(), options.timeout);
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
    if (!active.empty()) std::this_thread::yield();
  }
  count_thread_out();
}

namespace {

// A state over `comm` (made by the caller, freed by the group), under MpiLock.
std::shared_ptr<State> make_state_over(MPI_Comm comm, const ProcessGroupOptions& options) {
  auto s = std::make_shared<State>();
  s->comm = comm;
  s->options = options;
  s->options.timeout = detail::checked_timeout("MpiProcessGroup", options.timeout);
  s->debug = options.debug || detail::debug_from_env();
  // Errors come back as codes (turned into ember::Error) instead of aborting the job.
  check_mpi(MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(s->comm, &s->rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(s->comm, &s->size), "MPI_Comm_size");
  s->health.init("mpi", s->rank, s->size);
  return s;
}

std::shared_ptr<State> make_state(const ProcessGroupOptions& options, int local_rank) {
  detail::ensure_mpi_initialized();
  MpiLock lock;
  MPI_Comm comm = MPI_COMM_NULL;
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "MPI_Comm_dup");
  auto s = make_state_over(comm, options);
  if (local_rank < 0) {
    MPI_Comm node = MPI_COMM_NULL;
    check_mpi(MPI_Comm_split_type(s->comm, MPI_COMM_TYPE_SHARED, s->rank, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    check_mpi(MPI_Comm_rank(node, &local_rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_free(&node), "MPI_Comm_free");
  }
  s->local_rank = local_rank;
  s->global_ranks.resize(static_cast<size_t>(s->size));
  for (int r = 0; r < s->size; ++r) s->global_ranks[static_cast<size_t>(r)] = r;
  s->global_rank = s->rank;
  return s;
}

// NOTE: MPI_Comm_create_group is collective over the members only, so the other ranks go on
// at once, as new_group() promises. It is made over MPI_COMM_WORLD, which ember's groups
// never use themselves (each has its own duplicate), so no group's collective thread can be
// in a collective on the same communicator meanwhile; the job's ranks are MPI_COMM_WORLD's.
std::shared_ptr<State> make_subgroup_state(const State& parent, const SubgroupSpec& spec) {
  MpiLock lock;
  MPI_Group world = MPI_GROUP_NULL, members = MPI_GROUP_NULL;
  check_mpi(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
  const int made = MPI_Group_incl(world, static_cast<int>(spec.global_ranks.size()),
                                  spec.global_ranks.data(), &members);
  MPI_Group_free(&world);
  check_mpi(made, "MPI_Group_incl");
  MPI_Comm comm = MPI_COMM_NULL;
  // Members of one new_group() call share its number, which no other call in flight has.
  const int tag = static_cast<int>(spec.serial % 32768);
  const int created = MPI_Comm_create_group(MPI_COMM_WORLD, members, tag, &comm);
  MPI_Group_free(&members);
  check_mpi(created,
            "new_group: MPI_Comm_create_group over ranks " + detail::ranks_str(spec.global_ranks));
  auto s = make_state_over(comm, spec.options.value_or(parent.options));
  EMBER_ASSERT(s->rank == spec.rank && s->size == static_cast<int>(spec.ranks.size()),
               "new_group: MPI ranked this process ", s->rank, " of ", s->size, ", expected ",
               spec.rank, " of ", spec.ranks.size());
  s->local_rank = parent.local_rank;
  s->global_ranks = spec.global_ranks;
  s->global_rank = parent.global_rank;
  return s;
}

}  // namespace

MpiProcessGroup::MpiProcessGroup(ProcessGroupOptions options, int local_rank)
    : MpiProcessGroup(make_state(options, local_rank)) {}

MpiProcessGroup::MpiProcessGroup(std::shared_ptr<State> state)
    : BackendGroup(state->rank, state->local_rank, state->global_ranks, state->global_rank),
      state_(std::move(state)) {
  state_->thread = std::thread([s = state_.get()] { s->run(); });
  state_->p2p_thread = std::thread([s = state_.get()] { s->run_p2p(); });
}

MpiProcessGroup::~MpiProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && state_->health.broken()) {
    // See the NOTE in the header: the abandoned collective would hang MPI_Finalize, and the
    // communication thread may be blocked inside it (see start_main).
    detail::abort_mpi_job();
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
    state_->spare.reset();  // it holds the state: a cycle otherwise
  }
  state_->cv.notify_all();
  state_->p2p_cv.notify_all();
  state_->wait_for_threads();
  // It broke while the threads ended: one may be stuck in MPI for good, so no join first.
  if (!finalized && state_->health.broken()) detail::abort_mpi_job();
  state_->thread.join();
  state_->p2p_thread.join();
  if (finalized) return;
  MpiLock lock;
  MPI_Comm_free(&state_->comm);  // a failure here cannot be reported from a destructor
}

namespace {

using OpArgs = detail::Request;

[[noreturn, gnu::cold]] void refuse_count(const OpArgs& args) {
  throw Error(ember::detail::str_cat(args.name(), ": the MPI backend moves at most ", INT_MAX,
                                     " elements per call, got ", args.tensor->numel()));
}

// Under the lock, when the spare cannot be reused where it stands (see enqueue): collectives
// their waiters ran to the end leave the queue here, on the issuing thread, and a spare that
// somebody else still holds, or none at all, gives way to a new op.
[[gnu::noinline]] void renew_spare(const std::shared_ptr<State>& s, OpKind kind, int64_t finished) {
  while (!s->queue.empty() && s->queue.front()->seq <= finished) s->queue.pop_front();
  // Reused only when nobody else holds it: whoever dropped it last is done with it. (In a
  // broken group it may hold tensors MPI still uses, and stamp_op refuses the new op.)
  if (!s->spare || s->health.broken() || s->spare.use_count() != 1) {
    s->spare = std::make_shared<Op>(s, kind);
  }
}

// What only some ops carry: the tensor list, and for a CUDA tensor the event that orders its
// staging after the caller's stream.
[[gnu::noinline]] void attach_rare_args(Op& op, const OpArgs& args) {
  if (args.list != nullptr) op.list = *args.list;
  if (op.tensor.defined() && op.tensor.is_cuda()) {
    op.ready = std::make_unique<cuda::Event>();
    op.ready->record(cuda::current_stream(op.tensor.device().index));
  }
}

// Kept short, with the rarer paths out of line, for the reason Op::wait gives.
WorkHandle enqueue(const std::shared_ptr<State>& s, const OpArgs& args) {
  const bool collective = detail::is_collective(args.kind);
  bool wake = false;
  WorkHandle handle;
  {
    std::lock_guard<std::mutex> lock(s->mutex);
    const int64_t finished = s->collectives_finished.load();
    // The commonest case, a collective after one its waiter ran: the spare is alone in the
    // queue, finished, held by the queue and `spare` only. It is reused where it stands,
    // without a reference changing hands.
    const bool queued = collective && s->spare && !s->health.broken() && s->queue.size() == 1 &&
                        s->queue.front() == s->spare && s->spare->seq <= finished &&
                        s->spare.use_count() == 2;
    if (!queued) renew_spare(s, args.kind, finished);
    Op* const op = s->spare.get();  // reused or new
    // After the use_count read (here or in renew_spare): whoever dropped it is done with it.
    std::atomic_thread_fence(std::memory_order_acquire);
    op->recycle(args.kind);
    try {
      if (args.tensor != nullptr) op->tensor = *args.tensor;
      op->reduce = args.reduce;
      op->peer = args.peer;
      op->tag = args.tag;
      if (args.list != nullptr || (op->tensor.defined() && !op->tensor.is_cpu())) {
        attach_rare_args(*op, args);
      }
      detail::stamp_op(*op, s->counters, s->rank, s->health.broken(), s->health.reason(), s->debug,
                       args.uses_reduce());
    } catch (...) {
      op->release_tensors();  // refused: the spare keeps no tensor of the caller's
      op->seq = 0;            // left in the queue, it counts as finished
      throw;
    }
    if (collective) {
      if (!queued) s->queue.push_back(s->spare);
      s->collectives_issued.store(s->counters.collectives, std::memory_order_release);
      // NOTE: sent after the unlock, so a woken thread does not block on the mutex at once.
      // Another issuer that finds no sleeper meanwhile relies on this wake: its collective
      // may start only once this thread sends it (it is never lost).
      wake = std::exchange(s->thread_sleeps_for_work, false);
    } else {
      op->after = s->counters.collectives;  // issued before it: they finish first
      s->p2p_queue.push_back(s->spare);
      wake = true;
    }
    handle = s->spare;
  }
  if (wake) (collective ? s->cv : s->p2p_cv).notify_all();
  return handle;
}

}  // namespace

WorkHandle MpiProcessGroup::submit(const CollectiveRequest& request) {
  return enqueue(state_, request);
}

// MPI counts elements in an int: an all-reduce goes in pieces, the others in one call.
void MpiProcessGroup::check_devices(const CollectiveRequest& request) const {
  if (request.tensor != nullptr && request.kind != OpKind::kAllreduce &&
      request.tensor->numel() > INT_MAX) [[unlikely]]
    refuse_count(request);
}

std::shared_ptr<ProcessGroup> MpiProcessGroup::make_subgroup(const SubgroupSpec& spec) {
  if (spec.rank < 0) return nullptr;  // only the members meet
  return std::shared_ptr<MpiProcessGroup>(new MpiProcessGroup(make_subgroup_state(*state_, spec)));
}

}  // namespace ember::dist

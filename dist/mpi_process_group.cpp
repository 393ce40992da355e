#include "mpi_process_group.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
using detail::ScheduledOp;

// The MPI transport; the queue, threads, inline runs and timeouts are the scheduler's
// (detail/scheduler.h).
struct MpiProcessGroup::State final : detail::Transport {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1, local_rank = 0;
  std::vector<int> global_ranks;  // the job's ranks of the members
  int global_rank = 0;
  ProcessGroupOptions options;
  const detail::MpiTypeTable mpi_types;  // made after MPI is initialised (make_state)
  std::unique_ptr<detail::Scheduler> sched;

  std::shared_ptr<ScheduledOp> make_op(OpKind kind) override;
  void attach_device(ScheduledOp& op) override;
  void on_thread_start(ScheduledOp& op) override;
  void start(ScheduledOp& op) override;
  bool progress(ScheduledOp& op) override;
  void run_blocking(ScheduledOp& op, std::chrono::milliseconds limit) override;
  void p2p_start(ScheduledOp& op) override { start(op); }
  void p2p_poll(bool idle) override {
    if (!idle) std::this_thread::yield();
  }
  bool p2p_done(ScheduledOp& op) override { return progress(op); }
  bool still_in_use(const ScheduledOp& op) const override;
  void on_broken() override { detail::mark_mpi_job_broken(); }
  [[noreturn]] void abort_hung(const std::string& message) override;
  // Through the job's store (detail::mpi_job_store): every rank's records, into this rank's
  // folder too.
  void request_peer_dumps() override { detail::request_job_flight_dumps(); }
  void break_group(const std::string& message) { sched->break_group(message); }
};

namespace {

using State = MpiProcessGroup::State;

struct Op final : ScheduledOp {
  std::unique_ptr<cuda::Event> ready;  // CUDA tensors: recorded on the caller's stream

  // The thread that runs it only.
  enum class Stage { kFingerprint, kMain } stage = Stage::kMain;
  std::vector<Fingerprint> gathered;
  MPI_Request request = MPI_REQUEST_NULL;
  Tensor host;    // what MPI reads and writes for `tensor`
  Tensor packed;  // allgather / reduce_scatter: [size * numel], unless `list` is one block
  void* packed_data = nullptr;

  using ScheduledOp::ScheduledOp;

  // A field added here must be reset here too (ops are reused).
  void recycle_transport() override {
    ready.reset();
    stage = Stage::kMain;
    if (!gathered.empty()) gathered.clear();
    request = MPI_REQUEST_NULL;
    packed_data = nullptr;
  }
  void release_transport_buffers() override {
    if (host.defined() || packed.defined()) release_staging();
  }
  // Out of line, as the commonest collective, a CPU all-reduce, has none of these.
  [[gnu::noinline]] void release_staging() {
    host = Tensor();
    packed = Tensor();
  }
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
      // Blocking, as the all-reduce: Open MPI's MPI_Ireduce of megabytes runs several times
      // slower than MPI_Reduce (ZeRO-2's gradient reduces, bench/zero).
      rc = s.rank == op.peer ? MPI_Reduce(MPI_IN_PLACE, buf, count, type, tp.op, op.peer, s.comm)
                             : MPI_Reduce(buf, nullptr, count, type, tp.op, op.peer, s.comm);
      op.request = MPI_REQUEST_NULL;  // MPI_Test reports it complete at once
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

// Starts the exchange of the ranks' fingerprints that precedes every collective (its first
// stage); advance() checks them once gathered. Non-blocking on every path, so a rank's
// exchange meets a peer's goodbye (post_goodbye), which is non-blocking too.
void post_fingerprints(State& s, Op& op) {
  op.stage = Op::Stage::kFingerprint;
  op.gathered.resize(static_cast<size_t>(s.size));
  MpiLock lock;
  check_op(s, op,
           MPI_Iallgather(&op.fingerprint, sizeof(Fingerprint), MPI_BYTE, op.gathered.data(),
                          sizeof(Fingerprint), MPI_BYTE, s.comm, &op.request));
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
  if (detail::is_collective(op.kind) && s.size > 1) {
    post_fingerprints(s, op);
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
    detail::check_fingerprints(op.name(), op.gathered, s.rank);
    start_main(s, op);
    if (op.request != MPI_REQUEST_NULL) return false;  // non-blocking: polled on
  }
  finish(s, op);
  return true;
}

}  // namespace

std::shared_ptr<ScheduledOp> MpiProcessGroup::State::make_op(OpKind kind) {
  return std::make_shared<Op>(sched->shared_self(), kind);
}

void MpiProcessGroup::State::attach_device(ScheduledOp& base) {
  Op& op = static_cast<Op&>(base);
  if (!op.tensor.is_cuda()) return;
  op.ready = std::make_unique<cuda::Event>();
  op.ready->record(cuda::current_stream(op.tensor.device().index));
}

void MpiProcessGroup::State::on_thread_start(ScheduledOp& op) {
  adopt_device(static_cast<Op&>(op));
}

void MpiProcessGroup::State::start(ScheduledOp& op) { dist::start(*this, static_cast<Op&>(op)); }

bool MpiProcessGroup::State::progress(ScheduledOp& op) {
  return advance(*this, static_cast<Op&>(op));
}

bool MpiProcessGroup::State::still_in_use(const ScheduledOp& op) const {
  return static_cast<const Op&>(op).request != MPI_REQUEST_NULL;
}

void MpiProcessGroup::State::run_blocking(ScheduledOp& base, std::chrono::milliseconds limit) {
  Op& op = static_cast<Op&>(base);
  if (op.kind == OpKind::kAllreduce && op.tensor.is_cpu()) {
    // The commonest collective, kept short (a waiter's small all-reduce is all overhead): the
    // fingerprints are waited for in MPI_Wait rather than polled, then the all-reduce runs in
    // place in the caller's tensor (advance). As the blocking all-reduce's, a hang there is
    // the scheduler's watchdog's.
    op.started = std::chrono::steady_clock::now();
    dist::start(*this, op);
    if (op.stage == Op::Stage::kFingerprint) {
      MpiLock lock;
      check_op(*this, op, MPI_Wait(&op.request, MPI_STATUS_IGNORE));
    }
    const bool finished = advance(*this, op);
    EMBER_ASSERT(finished, "run_blocking: ", op.name(), " did not finish");
    return;
  }
  // Staging copies are not part of any graph; a CPU tensor needs none.
  std::optional<NoGradGuard> no_grad;
  if (!op.tensor.defined() || !op.tensor.is_cpu() || !op.list.empty()) no_grad.emplace();
  Transport::run_blocking(op, limit);
}

// A blocking MPI call cannot be interrupted: when one outlives its deadline, it is reported
// and the job ends, as an uncaught timeout would.
void MpiProcessGroup::State::abort_hung(const std::string& message) {
  sched->mark_broken_quietly(message);
  detail::mark_mpi_job_broken();
  std::fprintf(stderr, "ember::Error: %s\n", message.c_str());
  detail::dump_flight_records("the watchdog ended the mpi job on rank " + std::to_string(rank) +
                              ": " + message);
  request_peer_dumps();  // the hung rank's too, before MPI_Abort ends them
  detail::abort_mpi_job();
}

namespace {

// A state over `comm` (made by the caller, freed by the group), under MpiLock.
std::shared_ptr<State> make_state_over(MPI_Comm comm, const ProcessGroupOptions& options) {
  auto s = std::make_shared<State>();
  s->comm = comm;
  s->options = options;
  s->options.timeout = detail::checked_timeout("MpiProcessGroup", options.timeout);
  // Errors come back as codes (turned into ember::Error) instead of aborting the job.
  check_mpi(MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(s->comm, &s->rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(s->comm, &s->size), "MPI_Comm_size");
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
    : MpiProcessGroup(make_state(options, local_rank)) {
  // Made once per process (later groups only hear its address again): where the ranks ask
  // each other for their flight records. A world of one has nobody to ask.
  if (state_->size > 1) detail::mpi_job_store(state_->comm, {}, state_->options.timeout);
}

MpiProcessGroup::MpiProcessGroup(std::shared_ptr<State> state)
    : BackendGroup(state->rank, state->local_rank, state->global_ranks, state->global_rank),
      state_(std::move(state)) {
  State& s = *state_;
  s.sched = std::make_unique<detail::Scheduler>(s, "mpi", s.rank, s.global_ranks, s.global_rank,
                                                s.options);
  s.sched->start_threads(std::shared_ptr<detail::Scheduler>(state_, s.sched.get()));
}

namespace {

// How long a goodbye still pending at exit (a peer that never leaves nor collects) may hold
// up MPI_Finalize.
constexpr auto kGoodbyeLinger = std::chrono::seconds(2);

}  // namespace

MpiProcessGroup::~MpiProcessGroup() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  detail::Scheduler& sched = *state_->sched;
  if (!finalized && sched.health().broken()) {
    // See the NOTE in the header: the abandoned collective would hang MPI_Finalize, and the
    // communication thread may be blocked inside it (see start_main).
    detail::abort_mpi_job();
  }
  sched.stop_and_wait();
  // It broke while the threads ended: one may be stuck in MPI for good, so no join first.
  if (!finalized && sched.health().broken()) detail::abort_mpi_job();
  sched.join();
  if (finalized) return;
  MpiLock lock;
  if (state_->size > 1) {  // the group is healthy here: tell the peers this rank left
    const Fingerprint bye = sched.goodbye();
    detail::post_goodbye(state_->comm, &bye, sizeof(bye), state_->size, kGoodbyeLinger);
  }
  MPI_Comm_free(&state_->comm);  // a failure here cannot be reported from a destructor
}

namespace {

[[noreturn, gnu::cold]] void refuse_count(const CollectiveRequest& r) {
  throw Error(ember::detail::str_cat(r.name(), ": the MPI backend moves at most ", INT_MAX,
                                     " elements per call, got ", r.tensor->numel()));
}

}  // namespace

WorkHandle MpiProcessGroup::submit(const CollectiveRequest& request) {
  return state_->sched->enqueue(request);
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

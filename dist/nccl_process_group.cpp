#include "nccl_process_group.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include <ember/tensor/allocator.h>
#include <ember/tensor/cuda.h>
#include <ember/tensor/grad_mode.h>
#include <ember/tensor/ops.h>

#include "detail/common.h"
#include "detail/engine.h"
#include "detail/flight.h"
#include "detail/store_check.h"

namespace ember::dist {

using detail::Fingerprint;
using detail::OpKind;
using Clock = std::chrono::steady_clock;

static_assert(sizeof(ncclUniqueId) == sizeof(NcclProcessGroup::UniqueId));

namespace {

void check_cuda(cudaError_t code, const std::string& what) {
  EMBER_CHECK(code == cudaSuccess, what, cudaGetErrorString(code));
}

void check_nccl(ncclResult_t code, ncclComm_t comm, const std::string& what) {
  if (code == ncclSuccess || code == ncclInProgress) return;
  const char* detail = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  throw Error(what + ": " + ncclGetErrorString(code) +
              (detail != nullptr && detail[0] != '\0' ? std::string(" (") + detail + ")" : ""));
}

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case kF32:
      return ncclFloat32;
    case kF64:
      return ncclFloat64;
    case kF16:
      return ncclFloat16;
    case kBF16:
      return ncclBfloat16;
    case kI64:
      return ncclInt64;
    case kI32:
      return ncclInt32;
    case kU8:
    case kBool:
      return ncclUint8;
  }
  return ncclUint8;
}

// bool travels as a byte: sum is logical or (max), min is logical and.
ncclRedOp_t nccl_op(DType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return dtype == kBool ? ncclMax : ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

}  // namespace

struct NcclProcessGroup::State {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  std::vector<int> global_ranks;  // the job's ranks of the members
  int global_rank = 0;
  ProcessGroupOptions options;
  bool debug = false;
  cuda::Stream stream;
  std::mutex issue_mutex;  // issue order is the order NCCL sees
  int64_t collectives = 0, p2p = 0;
  cuda::Event ready;  // re-recorded at every issue, under issue_mutex
  std::atomic<bool> broken{false};
  std::mutex broken_mutex;  // guards comm (every call on it: see with_comm) and broken_message
  std::string broken_message;
  // The group's last collectives (flight_recorder.h): issued and started at once (the stream
  // has them), ended when the watchdog sees their event.
  std::unique_ptr<detail::FlightRecorder> recorder;

  // An operation as the watchdog sees it: issued, and not yet seen done.
  struct Tracked {
    cuda::Event done;
    std::string name;
    int64_t seq = 0;  // a collective's number (the recorder's), 0 for a send or recv
    Clock::time_point deadline;
    std::atomic<bool> host_waited{false};  // a blocking wait enforces its own limit
  };
  static constexpr std::chrono::milliseconds kWatchPeriod{20};
  std::mutex watch_mutex;
  std::condition_variable watch_cv;
  std::vector<std::shared_ptr<Tracked>> in_flight;
  bool stopping = false;
  bool destroying = false;  // under blocking_wait the watchdog reports nothing until then
  std::thread watchdog;
  // The fingerprint check over the side channel (null without one), and what this rank's
  // goodbye names: the kind of its last collective. Last: it stops before the rest goes.
  int32_t last_kind = -1;
  std::unique_ptr<detail::StoreFingerprintCheck> side_check;

  void watch(std::shared_ptr<Tracked> op) {
    std::lock_guard<std::mutex> lock(watch_mutex);
    in_flight.push_back(std::move(op));
  }

  // NOTE: a wait with the group's timeout only orders the caller's stream (see NcclWork), so
  // nobody may be blocked on a collective that never finishes: this thread then reports it
  // and ends the process, as PyTorch's NCCL watchdog does. It wakes every kWatchPeriod.
  void run_watchdog() {
    cudaSetDevice(device);  // else its CUDA calls would make a context on device 0
    std::unique_lock<std::mutex> lock(watch_mutex);
    while (!stopping) {
      watch_cv.wait_for(lock, kWatchPeriod);
      std::string failure;
      bool unloading = false;
      std::erase_if(in_flight, [&](const std::shared_ptr<Tracked>& op) {
        const cudaError_t status = cudaEventQuery(op->done.handle());
        if (status == cudaErrorNotReady) {
          cudaGetLastError();  // the runtime keeps "not ready" as this thread's last error
          return false;
        }
        if (status == cudaErrorCudartUnloading) unloading = true;  // the process is ending
        if (op->seq > 0) recorder->ended(op->seq, status != cudaSuccess);
        if (status != cudaSuccess && failure.empty()) {
          failure = op->name + " on rank " + std::to_string(rank) + " failed: CUDA reported " +
                    cudaGetErrorString(status);
        }
        return true;
      });
      if (unloading) return;
      if (broken.load()) continue;  // whoever broke it reports it
      // Under blocking_wait every wait enforces its own limit and reports; only an operation
      // nobody waited on that holds up the group's destruction is the watchdog's.
      if (options.blocking_wait && !destroying) continue;
      if (failure.empty() && !in_flight.empty()) failure = check_in_flight();
      if (failure.empty()) continue;
      {
        // Not aborted: ncclCommAbort frees device memory, which waits for the whole device,
        // and the stuck operation may be what the device waits for.
        std::lock_guard<std::mutex> broken_lock(broken_mutex);
        if (broken.exchange(true)) continue;  // a blocking wait broke it first
        broken_message = failure;
      }
      std::fprintf(stderr, "ember: %s; the NCCL watchdog ends the process\n", failure.c_str());
      if (recorder->on()) {
        recorder->set_broken(failure);
        detail::dump_flight_records("the NCCL watchdog ends the process: " + failure);
        detail::request_job_flight_dumps();  // under mpirun: every rank's, through the job's store
      }
      std::fflush(nullptr);  // the ranks' own output too
      std::_Exit(1);
    }
  }

  // Under watch_mutex: an asynchronous NCCL error, or the first operation past its deadline
  // that no blocking wait watches. A blocking wait in progress reports an error itself, as an
  // ember::Error its caller may catch.
  std::string check_in_flight() {
    const ncclResult_t async = async_error();
    if (async != ncclSuccess && async != ncclInProgress) {
      for (const auto& op : in_flight) {
        if (op->host_waited.load()) return "";
      }
      return in_flight.front()->name + " on rank " + std::to_string(rank) +
             " failed: NCCL reported " + ncclGetErrorString(async);
    }
    const auto now = Clock::now();
    for (const auto& op : in_flight) {
      if (now > op->deadline && !op->host_waited.load())
        return detail::timeout_message(op->name, rank, options.timeout, "nccl", size);
    }
    return "";
  }

  // The communicator's asynchronous error; ncclSuccess once it was aborted.
  ncclResult_t async_error() {
    std::lock_guard<std::mutex> lock(broken_mutex);
    ncclResult_t async = ncclSuccess;
    if (comm != nullptr && ncclCommGetAsyncError(comm, &async) != ncclSuccess) return ncclSuccess;
    return async;
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lock(watch_mutex);
      stopping = true;
    }
    watch_cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }

  // Aborts the communicator (unblocking its kernels) and remembers why. Never during a call
  // on it from another thread: every call holds broken_mutex (with_comm) and finds the
  // communicator gone once it is taken here. The abort itself runs without the lock: it frees
  // device memory, which can wait on the whole device, and the watchdog and other threads
  // must not wait behind it.
  void break_group(const std::string& message) {
    ncclComm_t aborted = nullptr;
    {
      std::lock_guard<std::mutex> lock(broken_mutex);
      if (broken.exchange(true)) return;
      broken_message = message;
      aborted = std::exchange(comm, nullptr);
    }
    detail::report_broken_group("nccl", rank, message);
    if (recorder->on()) {
      recorder->set_broken(message);
      detail::dump_flight_records("the nccl group broke on rank " + std::to_string(rank) + ": " +
                                  message);
      detail::request_job_flight_dumps();
    }
    if (aborted != nullptr) ncclCommAbort(aborted);  // nothing more to report if this fails too
  }

  // Polls until `event` completed; ember::Error (and a broken group) on an asynchronous
  // NCCL error or after `limit`.
  void host_wait(const cuda::Event& event, const std::string& what,
                 std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    for (int spins = 0;; ++spins) {
      if (broken.load()) {
        std::lock_guard<std::mutex> lock(broken_mutex);
        throw Error(what + " on rank " + std::to_string(rank) +
                    ": the process group failed earlier: " + broken_message);
      }
      if (event.query()) return;
      const ncclResult_t async = async_error();
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string message = what + " on rank " + std::to_string(rank) +
                                    " failed: NCCL reported " + ncclGetErrorString(async);
        break_group(message);
        throw Error(message);
      }
      if (Clock::now() > deadline) {
        const std::string message = detail::timeout_message(what, rank, limit, "nccl", size);
        break_group(message);
        throw Error(message);
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Runs `nccl(comm)` under broken_mutex, so break_group cannot abort the communicator in the
  // middle (the calls are non-blocking: they return at once); ember::Error on its failure,
  // or when the group was aborted already.
  template <typename F>
  ncclResult_t with_comm(F&& nccl, const std::string& what) {
    std::lock_guard<std::mutex> lock(broken_mutex);
    EMBER_CHECK(comm != nullptr, what, "the process group failed earlier: ", broken_message);
    const ncclResult_t code = nccl(comm);
    check_nccl(code, comm, what);
    return code;
  }

  // Non-blocking communicators may leave a call in progress: settle it before the next one.
  void settle(ncclResult_t code, const std::string& what) {
    if (code != ncclInProgress) return;
    const auto deadline = Clock::now() + options.timeout;
    for (;;) {
      const ncclResult_t state = with_comm(
          [](ncclComm_t c) {
            ncclResult_t async = ncclInProgress;
            const ncclResult_t status = ncclCommGetAsyncError(c, &async);
            return status != ncclSuccess ? status : async;
          },
          what);
      if (state == ncclSuccess) return;
      if (Clock::now() > deadline) {
        const std::string message =
            detail::timeout_message(what, rank, options.timeout, "nccl", size);
        break_group(message);
        throw Error(message);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
};

namespace {

using State = NcclProcessGroup::State;

// wait() with the group's timeout orders the caller's current stream after the operation and
// returns, as PyTorch's NCCL Work does, so the host goes on queueing work (the optimizer step
// after DDP's last bucket) while the GPU communicates; the watchdog enforces the timeout. An
// explicit timeout, and a barrier, block the host until the operation is done.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<State> state, const std::string& name, int64_t seq,
           std::vector<Tensor> keep, bool blocking)
      : state_(std::move(state)),
        keep_(std::move(keep)),
        op_(std::make_shared<State::Tracked>()),
        blocking_(blocking) {
    op_->name = name;
    op_->seq = seq;
    op_->deadline = Clock::now() + state_->options.timeout;
    op_->done.record(state_->stream);
    state_->watch(op_);
  }
  bool is_completed() override { return state_->broken.load() || op_->done.query(); }
  void wait(std::chrono::milliseconds timeout) override {
    if (blocking_ || timeout.count() > 0 || state_->options.blocking_wait) {
      op_->host_waited = true;
      state_->host_wait(op_->done, op_->name, detail::wait_limit(timeout, state_->options.timeout));
    } else if (state_->broken.load()) {
      std::lock_guard<std::mutex> lock(state_->broken_mutex);
      throw Error(op_->name + " on rank " + std::to_string(state_->rank) +
                  ": the process group failed earlier: " + state_->broken_message);
    }
    op_->done.wait(cuda::current_stream(state_->device));
    keep_.clear();  // the caching allocator holds their blocks for the NCCL stream
  }

 private:
  std::shared_ptr<State> state_;
  std::vector<Tensor> keep_;  // inputs, outputs and scratch, alive until waited on
  std::shared_ptr<State::Tracked> op_;
  bool blocking_;
};

void check_device(const char* op, const Tensor& t, int device) {
  EMBER_CHECK(t.is_cuda() && t.device().index == device, op,
              "the NCCL group works on cuda:", device, " but the tensor is on ", t.device());
}

// Everything one call needs: the issue lock, its name and its ordering against the caller.
// NOTE: once the sequence number is taken, the other ranks go on into the operation whatever
// happens here, so any failure on this rank from then on (an allocation, a copy, the NCCL
// call) breaks the group: a later operation here would pair with theirs. Only a debug-mode
// mismatch, which every rank sees and skips, leaves it usable.
class Issue {
 public:
  Issue(State& s, OpKind kind, const Tensor* t, int root, int reduce)
      : s_(s), lock_(s.issue_mutex) {
    const bool collective = detail::is_collective(kind);
    const int64_t seq = collective ? ++s.collectives : ++s.p2p;
    name_ = std::string(detail::op_kind_name(kind)) + " #" + std::to_string(seq);
    if (collective) seq_ = seq;
    if (s.broken.load()) {
      std::lock_guard<std::mutex> lock(s.broken_mutex);
      throw Error(
          name_ + " on rank " + std::to_string(s.rank) +
          ": the process group cannot be used after an earlier failure: " + s.broken_message);
    }
    try {
      device_.emplace(s.device);
      // A stream waits for an event's record at the time of the call: re-recording is safe.
      s.ready.record(cuda::current_stream(s.device));
      s.ready.wait(s.stream);
      if (collective) {
        const Fingerprint mine = Fingerprint::of(kind, seq, t, root, reduce);
        s.recorder->enqueued(mine);
        s.recorder->started(seq);  // on the stream from here on
        if (s.debug) check_fingerprints(mine);
        s.last_kind = static_cast<int32_t>(kind);
        if (s.side_check) s.side_check->post(mine);
      }
    } catch (const detail::FingerprintMismatch&) {
      throw;
    } catch (const std::exception& e) {
      s.break_group(e.what());
      throw;
    }
  }
  // Left by an exception before finish(): see the NOTE above. (A failed call() broke the
  // group with its own message already.)
  ~Issue() {
    if (finished_ || std::uncaught_exceptions() <= uncaught_) return;
    try {
      s_.break_group(name_ + " on rank " + std::to_string(s_.rank) +
                     " failed on this rank after the other ranks went into it");
    } catch (...) {  // out of memory while unwinding: the caller gets the first failure
    }
  }
  Issue(const Issue&) = delete;
  Issue& operator=(const Issue&) = delete;

  const std::string& name() const { return name_; }
  // Makes the NCCL call `nccl(comm)`. Its failure breaks the group: the other ranks went on
  // into this collective, so a later one here would pair with theirs.
  template <typename F>
  void call(F&& nccl) {
    const std::string what = name_ + " on rank " + std::to_string(s_.rank);
    try {
      s_.settle(s_.with_comm(nccl, what), what);
    } catch (const std::exception& e) {
      s_.break_group(e.what());
      throw;
    }
  }
  WorkHandle finish(std::shared_ptr<State> s, std::vector<Tensor> keep, bool blocking = false) {
    // Blocks of the caching allocator are not reused before the NCCL stream is done with them;
    // memory the caller owns (from_blob) is the caller's to keep until the wait.
    for (const Tensor& t : keep) cuda::record_stream(t.storage().data(), s->stream);
    WorkHandle work =
        std::make_shared<NcclWork>(std::move(s), name_, seq_, std::move(keep), blocking);
    finished_ = true;
    return work;
  }

 private:
  void check_fingerprints(const Fingerprint& mine) {
    const int64_t bytes = sizeof(Fingerprint);
    Tensor host = empty({bytes}, TensorOptions(kU8).with_pinned_memory());
    std::memcpy(host.data_ptr(), &mine, sizeof(Fingerprint));
    Tensor all_host = empty({bytes * s_.size}, TensorOptions(kU8).with_pinned_memory());
    cuda::StreamGuard guard(s_.stream);
    // Not blocking: the stream may be held up behind a hung collective, and host_wait below
    // is what bounds the wait.
    Tensor dev = host.to(cuda_device(s_.device), /*non_blocking=*/true);
    Tensor all_dev = empty({bytes * s_.size}, TensorOptions(kU8, cuda_device(s_.device)));
    call([&](ncclComm_t comm) {
      return ncclAllGather(dev.data_ptr(), all_dev.data_ptr(), static_cast<size_t>(bytes),
                           ncclUint8, comm, s_.stream.handle());
    });
    check_cuda(cudaMemcpyAsync(all_host.data_ptr(), all_dev.data_ptr(),
                               static_cast<size_t>(bytes * s_.size), cudaMemcpyDeviceToHost,
                               s_.stream.handle()),
               name_ + " (debug check): cudaMemcpyAsync");
    // all_host may be dropped (by a throw below) before the copy is done.
    if (!::ember::detail::record_pinned_use(all_host.storage().data(), s_.stream.handle())) {
      check_cuda(cudaStreamSynchronize(s_.stream.handle()), name_ + " (debug check)");
    }
    cuda::Event copied;
    copied.record(s_.stream);
    s_.host_wait(copied, name_ + " (debug check)", s_.options.timeout);
    std::vector<Fingerprint> all(static_cast<size_t>(s_.size));
    std::memcpy(all.data(), all_host.data_ptr(), all.size() * sizeof(Fingerprint));
    detail::check_fingerprints(name_, all, s_.rank);
  }

  State& s_;
  std::lock_guard<std::mutex> lock_;
  std::string name_;
  std::optional<cuda::DeviceGuard> device_;  // the caller's device comes back
  const int uncaught_ = std::uncaught_exceptions();
  bool finished_ = false;
  int64_t seq_ = 0;  // a collective's number; 0 for a send or recv
};

// A [size * numel] scratch tensor on the NCCL stream's pool.
Tensor scratch(const State& s, const Tensor& like) {
  cuda::StreamGuard guard(s.stream);
  return empty({like.numel() * s.size}, like.options());
}

// True when the tensors of `list` lie one after another in device memory.
bool consecutive(const std::vector<Tensor>& list) {
  const auto* base = static_cast<const char*>(list[0].data_ptr());
  for (size_t r = 0; r < list.size(); ++r) {
    if (static_cast<const char*>(list[r].data_ptr()) != base + r * list[0].nbytes()) return false;
  }
  return true;
}

}  // namespace

NcclProcessGroup::UniqueId NcclProcessGroup::create_unique_id() {
  ncclUniqueId id;
  check_nccl(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
  UniqueId bytes;
  std::memcpy(bytes.data(), &id, sizeof(id));
  return bytes;
}

namespace {

std::shared_ptr<State> make_state(int rank, int size, int device,
                                  const ProcessGroupOptions& options) {
  EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclProcessGroup", "rank ", rank,
              " is not in a group of ", size);
  EMBER_CHECK(device >= 0 && device < cuda::device_count(), "NcclProcessGroup", "cuda:", device,
              " is not a visible device (", cuda::device_count(), " visible)");
  auto state = std::make_shared<State>();
  State& s = *state;
  s.rank = rank;
  s.size = size;
  s.device = device;
  s.options = options;
  s.options.timeout = detail::checked_timeout("NcclProcessGroup", options.timeout);
  s.debug = options.debug || detail::debug_from_env();
  cuda::set_device(device);
  s.stream = cuda::Stream::create(device, /*high_priority=*/true);
  return state;
}

// Non-blocking initialisation, so a rank that never joins cannot hang the others: `init`
// makes s.comm with a non-blocking config (ncclCommInitRankConfig, ncclCommSplit).
template <typename Init>
void init_comm(State& s, const std::string& what, Init&& init) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  try {
    const ncclResult_t code = init(&s.comm, &config);
    check_nccl(code, s.comm, what);  // no other thread uses the group yet
    s.settle(code, what);
  } catch (...) {
    // A communicator that failed to start still holds NCCL's threads and memory.
    if (s.comm != nullptr) ncclCommAbort(std::exchange(s.comm, nullptr));
    throw;
  }
}

std::shared_ptr<State> make_world_state(int rank, int size, int device,
                                        const NcclProcessGroup::UniqueId& id,
                                        const ProcessGroupOptions& options) {
  auto state = make_state(rank, size, device, options);
  for (int r = 0; r < size; ++r) state->global_ranks.push_back(r);
  state->global_rank = rank;
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.data(), sizeof(nccl_id));
  init_comm(*state,
            "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")",
            [&](ncclComm_t* comm, ncclConfig_t* config) {
              return ncclCommInitRankConfig(comm, size, nccl_id, rank, config);
            });
  return state;
}

}  // namespace

NcclProcessGroup::NcclProcessGroup(int rank, int size, int local_rank, int device,
                                   const UniqueId& id, ProcessGroupOptions options,
                                   SideChannel side)
    : NcclProcessGroup(make_world_state(rank, size, device, id, options), local_rank,
                       std::move(side)) {}

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<State> state, int local_rank, SideChannel side)
    : BackendGroup(state->rank, local_rank, state->global_ranks, state->global_rank),
      state_(std::move(state)),
      side_(std::move(side)) {
  State& s = *state_;
  s.recorder =
      std::make_unique<detail::FlightRecorder>("nccl", s.rank, s.global_ranks, s.global_rank);
  s.watchdog = std::thread([state = &s] { state->run_watchdog(); });
  if (side_.store != nullptr) {
    // A mismatch or a peer's goodbye found beside a collective already issued: the ranks are
    // out of step, so the group breaks (aborted, as the watchdog's own failures do).
    s.side_check = std::make_unique<detail::StoreFingerprintCheck>(
        side_.store, side_.prefix, s.rank, s.size, s.options.timeout,
        [state = &s](const std::string& message) { state->break_group(message); });
  }
}

// NOTE: ncclCommSplit is collective over the parent: every rank of it calls this, the
// non-members with NCCL_SPLIT_NOCOLOR (they get no communicator). It holds the parent's issue
// lock, so no operation of the parent's goes to NCCL meanwhile.
std::shared_ptr<ProcessGroup> NcclProcessGroup::make_subgroup(const SubgroupSpec& spec) {
  State& parent = *state_;
  const std::string what = "new_group " + detail::ranks_str(spec.global_ranks) +
                           ": ncclCommSplit on rank " + std::to_string(parent.rank);
  std::lock_guard<std::mutex> issue_lock(parent.issue_mutex);
  EMBER_CHECK(!parent.broken.load(), what, "the parent group failed earlier");
  cuda::DeviceGuard device(parent.device);
  if (spec.rank < 0) {
    ncclComm_t none = nullptr;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t code = parent.with_comm(
        [&](ncclComm_t comm) {
          return ncclCommSplit(comm, NCCL_SPLIT_NOCOLOR, parent.rank, &none, &config);
        },
        what);
    parent.settle(code, what);
    return nullptr;
  }
  auto state = make_state(spec.rank, static_cast<int>(spec.ranks.size()), parent.device,
                          spec.options.value_or(parent.options));
  state->global_ranks = spec.global_ranks;
  state->global_rank = parent.global_rank;
  init_comm(*state, what, [&](ncclComm_t* comm, ncclConfig_t* config) {
    return parent.with_comm(
        [&](ncclComm_t parent_comm) {
          return ncclCommSplit(parent_comm, 0, spec.rank, comm, config);
        },
        what);
  });
  parent.settle(ncclInProgress, what);  // a non-blocking split may leave the parent busy too
  SideChannel side;
  if (side_.store != nullptr)
    side = {side_.store, side_.prefix + "/" + std::to_string(spec.serial)};
  return std::shared_ptr<NcclProcessGroup>(
      new NcclProcessGroup(std::move(state), local_rank(), std::move(side)));
}

NcclProcessGroup::~NcclProcessGroup() {
  State& s = *state_;
  // Goodbye first: a peer waiting in a collective this rank never issues fails at once.
  if (s.side_check) {
    s.side_check->leave(detail::Fingerprint::goodbye(s.collectives, s.last_kind));
  }
  // Work still queued finishes first; the watchdog, still running, ends the process if it
  // never does (a destructor cannot report failures), also under blocking_wait.
  {
    std::lock_guard<std::mutex> lock(s.watch_mutex);
    s.destroying = true;
  }
  while (!s.broken.load()) {
    const cudaError_t status = cudaStreamQuery(s.stream.handle());
    if (status != cudaSuccess) cudaGetLastError();  // "not ready" stays as the last error too
    if (status != cudaErrorNotReady) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  s.stop_watchdog();
  std::lock_guard<std::mutex> lock(s.broken_mutex);
  if (s.comm == nullptr) return;
  ncclCommDestroy(s.comm);
  s.comm = nullptr;  // a Work that outlives the group must not reach the freed communicator
}

int NcclProcessGroup::device() const { return state_->device; }
Device NcclProcessGroup::tensor_device() const { return cuda_device(state_->device); }

namespace {

WorkHandle run_allreduce(const std::shared_ptr<State>& state, const Tensor& tensor, ReduceOp op) {
  State& s = *state;
  Issue issue(s, OpKind::kAllreduce, &tensor, -1, static_cast<int>(op));
  issue.call([&](ncclComm_t comm) {
    return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                         nccl_type(tensor.dtype()), nccl_op(tensor.dtype(), op), comm,
                         s.stream.handle());
  });
  return issue.finish(state, {tensor});
}

WorkHandle run_broadcast(const std::shared_ptr<State>& state, const Tensor& tensor, int root) {
  State& s = *state;
  Issue issue(s, OpKind::kBroadcast, &tensor, root, -1);
  issue.call([&](ncclComm_t comm) {
    return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                         nccl_type(tensor.dtype()), root, comm, s.stream.handle());
  });
  return issue.finish(state, {tensor});
}

WorkHandle run_allgather(const std::shared_ptr<State>& state, const std::vector<Tensor>& outputs,
                         const Tensor& input) {
  State& s = *state;
  Issue issue(s, OpKind::kAllgather, &input, -1, -1);
  const bool direct = consecutive(outputs);
  Tensor gathered = direct ? outputs[0] : scratch(s, input);
  issue.call([&](ncclComm_t comm) {
    return ncclAllGather(input.data_ptr(), gathered.data_ptr(), static_cast<size_t>(input.numel()),
                         nccl_type(input.dtype()), comm, s.stream.handle());
  });
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  if (!direct) {
    cuda::StreamGuard guard(s.stream);
    NoGradGuard no_grad;
    const int64_t n = input.numel();
    for (size_t r = 0; r < outputs.size(); ++r) {
      outputs[r].detach().copy_(
          gathered.narrow(0, static_cast<int64_t>(r) * n, n).view(input.sizes()));
    }
    keep.push_back(gathered);
  }
  return issue.finish(state, std::move(keep));
}

WorkHandle run_reduce(const std::shared_ptr<State>& state, const Tensor& tensor, int root,
                      ReduceOp op) {
  State& s = *state;
  Issue issue(s, OpKind::kReduce, &tensor, root, static_cast<int>(op));
  issue.call([&](ncclComm_t comm) {
    return ncclReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                      nccl_type(tensor.dtype()), nccl_op(tensor.dtype(), op), root, comm,
                      s.stream.handle());
  });
  return issue.finish(state, {tensor});
}

WorkHandle run_reduce_scatter(const std::shared_ptr<State>& state, const Tensor& output,
                              const std::vector<Tensor>& inputs, ReduceOp op) {
  State& s = *state;
  Issue issue(s, OpKind::kReduceScatter, &output, -1, static_cast<int>(op));
  const bool direct = consecutive(inputs);
  Tensor packed = direct ? inputs[0] : scratch(s, output);
  if (!direct) {
    cuda::StreamGuard guard(s.stream);
    NoGradGuard no_grad;
    const int64_t n = output.numel();
    for (size_t r = 0; r < inputs.size(); ++r) {
      packed.narrow(0, static_cast<int64_t>(r) * n, n).copy_(inputs[r].reshape({n}));
    }
  }
  issue.call([&](ncclComm_t comm) {
    return ncclReduceScatter(packed.data_ptr(), output.data_ptr(),
                             static_cast<size_t>(output.numel()), nccl_type(output.dtype()),
                             nccl_op(output.dtype(), op), comm, s.stream.handle());
  });
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  keep.push_back(packed);
  return issue.finish(state, std::move(keep));
}

WorkHandle run_barrier(const std::shared_ptr<State>& state) {
  State& s = *state;
  Issue issue(s, OpKind::kBarrier, nullptr, -1, -1);
  // Made under the issue's lock: no other thread's NCCL call on this (non-blocking)
  // communicator is still settling while work goes onto its stream.
  Tensor token = [&] {
    cuda::StreamGuard guard(s.stream);
    return zeros({1}, TensorOptions(kF32, cuda_device(s.device)));
  }();
  issue.call([&](ncclComm_t comm) {
    return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm,
                         s.stream.handle());
  });
  return issue.finish(state, {token}, /*blocking=*/true);  // a barrier holds the host
}

WorkHandle run_send(const std::shared_ptr<State>& state, const Tensor& tensor, int dst) {
  State& s = *state;
  Issue issue(s, OpKind::kSend, &tensor, -1, -1);
  issue.call([&](ncclComm_t comm) {
    return ncclSend(tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                    nccl_type(tensor.dtype()), dst, comm, s.stream.handle());
  });
  return issue.finish(state, {tensor});
}

WorkHandle run_recv(const std::shared_ptr<State>& state, const Tensor& tensor, int src) {
  State& s = *state;
  Issue issue(s, OpKind::kRecv, &tensor, -1, -1);
  issue.call([&](ncclComm_t comm) {
    return ncclRecv(tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                    nccl_type(tensor.dtype()), src, comm, s.stream.handle());
  });
  return issue.finish(state, {tensor});
}

}  // namespace

void NcclProcessGroup::check_devices(const CollectiveRequest& request) const {
  if (request.kind == OpKind::kSend || request.kind == OpKind::kRecv) {
    EMBER_CHECK(request.tag == 0, request.name(), "the NCCL backend has no tags (got ", request.tag,
                ")");
  }
  if (request.tensor != nullptr) check_device(request.name(), *request.tensor, state_->device);
}

WorkHandle NcclProcessGroup::submit(const CollectiveRequest& r) {
  switch (r.kind) {
    case OpKind::kAllreduce:
      return run_allreduce(state_, *r.tensor, r.reduce);
    case OpKind::kBroadcast:
      return run_broadcast(state_, *r.tensor, r.peer);
    case OpKind::kAllgather:
      return run_allgather(state_, *r.list, *r.tensor);
    case OpKind::kReduce:
      return run_reduce(state_, *r.tensor, r.peer, r.reduce);
    case OpKind::kReduceScatter:
      return run_reduce_scatter(state_, *r.tensor, *r.list, r.reduce);
    case OpKind::kBarrier:
      return run_barrier(state_);
    case OpKind::kSend:
      return run_send(state_, *r.tensor, r.peer);
    case OpKind::kRecv:
      return run_recv(state_, *r.tensor, r.peer);
  }
  throw Error("NcclProcessGroup: unknown operation");
}

}  // namespace ember::dist

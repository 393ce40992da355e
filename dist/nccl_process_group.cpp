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
  ProcessGroupOptions options;
  bool debug = false;
  cuda::Stream stream;
  std::mutex issue_mutex;  // issue order is the order NCCL sees
  int64_t collectives = 0, p2p = 0;
  cuda::Event ready;  // re-recorded at every issue, under issue_mutex
  std::atomic<bool> broken{false};
  std::mutex broken_mutex;  // guards comm (every call on it: see with_comm) and broken_message
  std::string broken_message;

  // An operation as the watchdog sees it: issued, and not yet seen done.
  struct Tracked {
    cuda::Event done;
    std::string name;
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
  NcclWork(std::shared_ptr<State> state, const std::string& name, std::vector<Tensor> keep,
           bool blocking)
      : state_(std::move(state)),
        keep_(std::move(keep)),
        op_(std::make_shared<State::Tracked>()),
        blocking_(blocking) {
    op_->name = name;
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
      if (s.debug && collective) check_fingerprints(Fingerprint::of(kind, seq, t, root, reduce));
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
    WorkHandle work = std::make_shared<NcclWork>(std::move(s), name_, std::move(keep), blocking);
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
    const std::string mismatch = detail::compare_fingerprints(all, s_.rank);
    if (!mismatch.empty()) throw detail::FingerprintMismatch(name_ + ": " + mismatch);
  }

  State& s_;
  std::lock_guard<std::mutex> lock_;
  std::string name_;
  std::optional<cuda::DeviceGuard> device_;  // the caller's device comes back
  const int uncaught_ = std::uncaught_exceptions();
  bool finished_ = false;
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

NcclProcessGroup::NcclProcessGroup(int rank, int size, int local_rank, int device,
                                   const UniqueId& id, ProcessGroupOptions options)
    : ProcessGroup(rank, size, local_rank), state_(std::make_shared<State>()) {
  EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclProcessGroup", "rank ", rank,
              " is not in a group of ", size);
  EMBER_CHECK(device >= 0 && device < cuda::device_count(), "NcclProcessGroup", "cuda:", device,
              " is not a visible device (", cuda::device_count(), " visible)");
  State& s = *state_;
  s.rank = rank;
  s.size = size;
  s.device = device;
  s.options = options;
  s.options.timeout = detail::checked_timeout("NcclProcessGroup", options.timeout);
  s.debug = options.debug || detail::debug_from_env();
  cuda::set_device(device);
  s.stream = cuda::Stream::create(device, /*high_priority=*/true);
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.data(), sizeof(nccl_id));
  // Non-blocking initialisation, so a rank that never joins cannot hang the others.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string what =
      "ncclCommInitRank (rank " + std::to_string(rank) + " of " + std::to_string(size) + ")";
  try {
    const ncclResult_t code = ncclCommInitRankConfig(&s.comm, size, nccl_id, rank, &config);
    check_nccl(code, s.comm, what);  // no other thread uses the group yet
    s.settle(code, what);
  } catch (...) {
    // A communicator that failed to start still holds NCCL's threads and memory.
    if (s.comm != nullptr) ncclCommAbort(std::exchange(s.comm, nullptr));
    throw;
  }
  s.watchdog = std::thread([state = state_.get()] { state->run_watchdog(); });
}

NcclProcessGroup::~NcclProcessGroup() {
  State& s = *state_;
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

WorkHandle NcclProcessGroup::allreduce(const Tensor& tensor, ReduceOp op) {
  detail::check_tensor("allreduce", tensor);
  detail::check_reduce_op("allreduce", tensor, op);
  check_device("allreduce", tensor, state_->device);
  State& s = *state_;
  Issue issue(s, OpKind::kAllreduce, &tensor, -1, static_cast<int>(op));
  issue.call([&](ncclComm_t comm) {
    return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                         nccl_type(tensor.dtype()), nccl_op(tensor.dtype(), op), comm,
                         s.stream.handle());
  });
  return issue.finish(state_, {tensor});
}

WorkHandle NcclProcessGroup::broadcast(const Tensor& tensor, int root) {
  detail::check_tensor("broadcast", tensor);
  detail::check_root("broadcast", root, size());
  check_device("broadcast", tensor, state_->device);
  State& s = *state_;
  Issue issue(s, OpKind::kBroadcast, &tensor, root, -1);
  issue.call([&](ncclComm_t comm) {
    return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                         nccl_type(tensor.dtype()), root, comm, s.stream.handle());
  });
  return issue.finish(state_, {tensor});
}

WorkHandle NcclProcessGroup::allgather(const std::vector<Tensor>& outputs, const Tensor& input) {
  detail::check_tensor("allgather", input);
  detail::check_list("allgather", "outputs", outputs, input, size());
  check_device("allgather", input, state_->device);
  State& s = *state_;
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
  return issue.finish(state_, std::move(keep));
}

WorkHandle NcclProcessGroup::reduce(const Tensor& tensor, int root, ReduceOp op) {
  detail::check_tensor("reduce", tensor);
  detail::check_root("reduce", root, size());
  detail::check_reduce_op("reduce", tensor, op);
  check_device("reduce", tensor, state_->device);
  State& s = *state_;
  Issue issue(s, OpKind::kReduce, &tensor, root, static_cast<int>(op));
  issue.call([&](ncclComm_t comm) {
    return ncclReduce(tensor.data_ptr(), tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                      nccl_type(tensor.dtype()), nccl_op(tensor.dtype(), op), root, comm,
                      s.stream.handle());
  });
  return issue.finish(state_, {tensor});
}

WorkHandle NcclProcessGroup::reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs,
                                            ReduceOp op) {
  detail::check_tensor("reduce_scatter", output);
  detail::check_list("reduce_scatter", "inputs", inputs, output, size());
  detail::check_reduce_op("reduce_scatter", output, op);
  check_device("reduce_scatter", output, state_->device);
  State& s = *state_;
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
  return issue.finish(state_, std::move(keep));
}

WorkHandle NcclProcessGroup::barrier() {
  State& s = *state_;
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
  return issue.finish(state_, {token}, /*blocking=*/true);  // a barrier holds the host
}

WorkHandle NcclProcessGroup::send(const Tensor& tensor, int dst, int tag) {
  detail::check_tensor("send", tensor);
  EMBER_CHECK(tag == 0, "send", "the NCCL backend has no tags (got ", tag, ")");
  detail::check_peer("send", dst, rank(), size());
  check_device("send", tensor, state_->device);
  State& s = *state_;
  Issue issue(s, OpKind::kSend, &tensor, -1, -1);
  issue.call([&](ncclComm_t comm) {
    return ncclSend(tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                    nccl_type(tensor.dtype()), dst, comm, s.stream.handle());
  });
  return issue.finish(state_, {tensor});
}

WorkHandle NcclProcessGroup::recv(const Tensor& tensor, int src, int tag) {
  detail::check_tensor("recv", tensor);
  EMBER_CHECK(tag == 0, "recv", "the NCCL backend has no tags (got ", tag, ")");
  detail::check_peer("recv", src, rank(), size());
  check_device("recv", tensor, state_->device);
  State& s = *state_;
  Issue issue(s, OpKind::kRecv, &tensor, -1, -1);
  issue.call([&](ncclComm_t comm) {
    return ncclRecv(tensor.data_ptr(), static_cast<size_t>(tensor.numel()),
                    nccl_type(tensor.dtype()), src, comm, s.stream.handle());
  });
  return issue.finish(state_, {tensor});
}

}  // namespace ember::dist

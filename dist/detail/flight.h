// The flight recorder's ring (see flight_recorder.h): one per process group, written by the
// collective engine (detail::Scheduler) as each collective is issued, starts and ends, read
// by the dumps. Recording is a handful of relaxed atomic stores and a coarse clock read,
// without a lock, so it stays on for every collective; a dump reads the ring while it is written
// and keeps only entries whose number did not change under it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <source_location>
#include <string>
#include <vector>

#include "common.h"

namespace ember::dist {
class TcpStore;
}

namespace ember::dist::detail {

enum class FlightState : int32_t { kEnqueued, kStarted, kCompleted, kFailed };
const char* flight_state_name(FlightState state);

// The calling thread's tag (CollectiveTag), or null.
const char* current_collective_tag();

// Where the collective the calling thread issues now was called from (dist::all_reduce and
// the other free functions set it for the call): what the recorder shows without a tag.
struct CallSite {
  const char* file = nullptr;  // source_location's: static storage
  int32_t line = 0;
};
CallSite current_call_site();
class CallSiteScope {
 public:
  explicit CallSiteScope(const std::source_location& where);
  ~CallSiteScope();
  CallSiteScope(const CallSiteScope&) = delete;
  CallSiteScope& operator=(const CallSiteScope&) = delete;

 private:
  CallSite previous_;
};

class FlightRecorder {
 public:
  static constexpr int64_t kCapacity = 2048;  // collectives kept per group

  // For member `rank` of a group whose members are the job's `global_ranks`, this process
  // being the job's `global_rank`. Registered for the process's dumps while it lives.
  FlightRecorder(const char* backend, int rank, std::vector<int> global_ranks, int global_rank);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // Collective `f.seq` was issued (its fingerprint says what it is), started, ended.
  void enqueued(const Fingerprint& f) {
    if (!on_) return;
    Entry& e = slot(f.seq);
    e.seq.store(-f.seq, std::memory_order_relaxed);  // being written
    std::atomic_thread_fence(std::memory_order_release);
    e.kind.store(f.kind, std::memory_order_relaxed);
    e.dtype.store(f.dtype, std::memory_order_relaxed);
    e.root.store(f.root, std::memory_order_relaxed);
    e.reduce.store(f.reduce, std::memory_order_relaxed);
    e.numel.store(f.numel, std::memory_order_relaxed);
    e.state.store(static_cast<int32_t>(FlightState::kEnqueued), std::memory_order_relaxed);
    const int64_t now = now_ns();
    e.enqueued_ns.store(now, std::memory_order_relaxed);
    e.started_ns.store(0, std::memory_order_relaxed);
    e.ended_ns.store(0, std::memory_order_relaxed);
    e.tag.store(current_collective_tag(), std::memory_order_relaxed);
    const CallSite site = current_call_site();
    e.file.store(site.file, std::memory_order_relaxed);
    e.line.store(site.line, std::memory_order_relaxed);
    e.seq.store(f.seq, std::memory_order_release);
  }
  void started(int64_t seq) {
    if (!on_) return;
    Entry& e = slot(seq);
    if (e.seq.load(std::memory_order_relaxed) != seq) return;  // overwritten since
    e.started_ns.store(now_ns(), std::memory_order_relaxed);
    e.state.store(static_cast<int32_t>(FlightState::kStarted), std::memory_order_relaxed);
  }
  void ended(int64_t seq, bool failed) {
    if (!on_) return;
    Entry& e = slot(seq);
    if (e.seq.load(std::memory_order_relaxed) != seq) return;
    e.ended_ns.store(now_ns(), std::memory_order_relaxed);
    e.state.store(static_cast<int32_t>(failed ? FlightState::kFailed : FlightState::kCompleted),
                  std::memory_order_relaxed);
  }
  // Why the group broke, for the dumps ("" while it works).
  void set_broken(const std::string& reason);

  bool on() const { return on_; }
  int global_rank() const { return global_rank_; }
  // This group's records as a JSON object (text), oldest first.
  std::string to_json() const;

  // The recorder's clock: CLOCK_MONOTONIC_COARSE, in nanoseconds.
  static int64_t now_ns();

 private:
  struct Entry {
    std::atomic<int64_t> seq{0};  // 0: empty; negative while being written
    std::atomic<int32_t> kind{0}, dtype{-1}, root{-1}, reduce{-1}, state{0};
    std::atomic<int64_t> numel{0}, enqueued_ns{0}, started_ns{0}, ended_ns{0};
    std::atomic<const char*> tag{nullptr};
    std::atomic<const char*> file{nullptr};
    std::atomic<int32_t> line{0};
  };
  Entry& slot(int64_t seq) { return ring_[static_cast<size_t>(seq % kCapacity)]; }

  const bool on_;
  const char* backend_;
  const int rank_;
  const std::vector<int> global_ranks_;
  const int global_rank_;
  int index_ = 0;  // among this process's groups of the same backend and members, by creation
  std::unique_ptr<Entry[]> ring_;
  mutable std::mutex broken_mutex_;
  std::string broken_;
};

// Writes every live recorder of this process to <flight_recorder_dir()>/rank<R>.json (R: the
// process's rank in the job) with `reason`, and says so on stderr; returns the path, or ""
// when writing failed (which it also reports). Never throws.
std::string dump_flight_records(const std::string& reason) noexcept;
// The text of this process's last dump ("" before the first), as written.
std::string last_flight_dump();

// The largest dump the analyzer reads, and a peer's dump gathered over a store may take.
constexpr size_t kMaxFlightDumpBytes = size_t{64} << 20;

// Dumps asked for and gathered over a store its ranks share (the TCP group's, the store of an
// MPI-launched job): a rank whose group broke dumps its records, then request() asks every
// peer to dump theirs, the hung one included (each answers from a thread that polls the store,
// answer()), and writes each answer into its own flight_recorder_dir(), so that the dumps of
// other nodes reach it without a shared folder. Keys under `prefix`: "requests" (a count),
// and per rank r "answered/<r>" (the requests r answered through) and "dump/<r>" (its last
// dump, replaced by the next): 2 keys per rank however often it is asked.
class StoreFlightDumps {
 public:
  // `answer_reason` is what an answer's dump says of why it was written.
  StoreFlightDumps(std::shared_ptr<TcpStore> store, std::string prefix, int rank, int size,
                   std::string answer_reason);
  StoreFlightDumps(const StoreFlightDumps&) = delete;
  StoreFlightDumps& operator=(const StoreFlightDumps&) = delete;

  // Publishes this rank's last dump as its answer to every request, asks every peer for
  // theirs, waits for them at most `wait` (a peer that died never answers; one that asked too,
  // or whose process ended, has answered) and writes those that came. Reports on stderr what
  // it gathered, or why it could not ask; never throws.
  void request(std::chrono::milliseconds wait) noexcept;
  // Called now and then: when a peer asked since the last call, dumps this process's records
  // and publishes them (rank 0 then also gathers everyone's answers, at most `wait`); a rank
  // that asked itself has answered every request with the dump it wrote then. False once the
  // store cannot be reached (its server ended): nobody can ask any more.
  bool answer(std::chrono::milliseconds wait) noexcept;
  // This process ends and answers no more: every request, this one's and later ones, reads
  // as answered without a dump, so no asker waits for it.
  void leave() noexcept;

 private:
  std::string key(const char* kind, int rank) const;
  // Publishes this rank's last dump as its answer to the requests through `through`.
  void publish(int64_t through);
  // Waits for every peer's answer to request `number` (at most `wait`), then writes them.
  void gather(int64_t number, std::chrono::milliseconds wait);

  std::shared_ptr<TcpStore> store_;
  std::string prefix_;
  int rank_, size_;
  std::string answer_reason_;
  std::mutex mutex_;              // one publish at a time
  int64_t answered_ = 0;          // under mutex_: the requests this rank answered through
  std::atomic<int64_t> seen_{0};  // requests this rank took note of (its own included)
  // This rank asked (its group broke): its own dump answers every request.
  std::atomic<bool> asked_{false};
};

// The job's dump exchange (the store of an MPI-launched job's: detail/mpi_runtime.h), set once
// the store is made; request_job_flight_dumps() asks every rank of the job through it (at
// most `wait` for their answers), and does nothing without one. Never throws.
void set_job_flight_dumps(std::shared_ptr<StoreFlightDumps> dumps);
void request_job_flight_dumps(std::chrono::milliseconds wait = std::chrono::seconds(3)) noexcept;

}  // namespace ember::dist::detail

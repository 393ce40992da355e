// The MPI library as ember uses it: initialisation at the thread level the communication
// threads need, status checks, and the mapping from ember dtypes and ReduceOps to MPI's.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>

#include <ember/dist/process_group.h>
#include <ember/dist/tcp_store.h>

namespace ember::dist::detail {

// Initialises MPI (MPI_THREAD_MULTIPLE requested) unless the program already did; ember then
// finalises it at exit. Throws ember::Error when the thread level is below
// MPI_THREAD_SERIALIZED.
void ensure_mpi_initialized();
// Throws ember::Error("<what>: <MPI's error string> (code N)") when `code` is not MPI_SUCCESS.
void check_mpi(int code, const std::string& what);
// Ends the whole job with MPI_Abort(MPI_COMM_WORLD, 1). A report this process wrote just
// before (the error that ends it) can be lost when the launcher tears the job down before
// forwarding it, so output is flushed and forwarding given a moment (200 ms) first.
[[noreturn]] void abort_mpi_job();

// Under MPI_THREAD_SERIALIZED, the lock every MPI call ember makes holds; null under
// MPI_THREAD_MULTIPLE (set when ember initialises MPI or finds it initialised).
extern std::atomic<std::mutex*> g_mpi_call_mutex;

// NOTE: under MPI_THREAD_SERIALIZED every MPI call ember makes holds this lock, so the
// communication threads of several groups never call MPI at once; under MPI_THREAD_MULTIPLE
// it is a no-op. The program's own MPI calls must then not run concurrently with ember's.
// Inline: it wraps every collective, and a call out of line costs its fast path more.
class MpiLock {
 public:
  MpiLock() : mutex_(g_mpi_call_mutex.load(std::memory_order_relaxed)) {
    if (mutex_ != nullptr) mutex_->lock();
  }
  ~MpiLock() {
    if (mutex_ != nullptr) mutex_->unlock();
  }
  MpiLock(const MpiLock&) = delete;
  MpiLock& operator=(const MpiLock&) = delete;

 private:
  std::mutex* mutex_;
};

// Marks the job as holding a collective that can never finish (a timed-out group): at exit
// ember then calls MPI_Abort instead of MPI_Finalize, which would wait for it forever.
void mark_mpi_job_broken();

// A group's goodbye: the MPI_Iallgather of `bytes` (its goodbye fingerprint) over `comm`,
// posted when the group is destroyed and left to finish, so ranks still waiting in a
// collective of the group learn at once who left. It must not wait: the other ranks may
// never issue another collective. Those still pending are given, at most, `linger` at exit
// before MPI is finalised. Under MpiLock.
void post_goodbye(MPI_Comm comm, const void* bytes, int count, int size,
                  std::chrono::milliseconds linger);

// The store of a job MPI launched (mpirun, or srun with PMI), for the groups MPI bootstraps
// (the MPI backend's, NCCL's), which have no store of their own: the same TcpStore that
// store-launched groups meet at (detail::shared_store), served by rank 0 on a free port of
// MASTER_ADDR when set, else of every IPv4 address of its host; the other ranks try those of
// its interfaces outside loopback in turn, then loopback (3 s each at most). With a job secret
// in the environment (EMBER_JOB_SECRET) clients prove it; the secret itself never travels.
// Collective over `comm`, which spans MPI_COMM_WORLD's ranks in their order (it, or a duplicate):
// one MPI_Bcast from rank 0 carries the store's address together with `payload` (rank 0's bytes
// reach every rank's buffer: NCCL's unique id), then the ranks agree that each reached the store.
// Rank 0 serves once per process; later calls broadcast the same address. The first store made also
// answers peers' requests for flight records (a thread polls it every 250 ms; see StoreFlightDumps
// and request_job_flight_dumps). Returns null on every rank when one could not reach it (within
// min(timeout, 30 s)), after saying why on stderr: the job then runs as it would without a store.
std::shared_ptr<TcpStore> mpi_job_store(MPI_Comm comm, std::span<char> payload,
                                        std::chrono::milliseconds timeout);

struct MpiTypeOp {
  MPI_Datatype type;
  MPI_Op op;
};
// The MPI datatype and reduction for each dtype and ReduceOp, looked up on every collective:
// f16 and bf16 use ember's own MPI_Ops (summed in float, rounded once per step); bool is a
// byte with sum = max (logical or), min = and. kAvg reduces with sum (the caller divides).
// Made once MPI is initialised (ember's f16 and bf16 reductions are MPI objects).
class MpiTypeTable {
 public:
  MpiTypeTable();
  MpiTypeOp operator()(DType dtype, ReduceOp op) const {
    return table_[static_cast<int>(dtype)][static_cast<int>(op)];
  }

 private:
  MpiTypeOp table_[kNumDTypes][kNumReduceOps];
};

}  // namespace ember::dist::detail

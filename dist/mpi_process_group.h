// The MPI backend: CPU tensors directly, CUDA tensors staged through pinned host memory.
//
// This file holds the MPI transport; the queue, threads, inline runs, timeouts and broken
// state described below are detail::Scheduler's (dist/detail/scheduler.h), shared with the
// TCP backend.
//
// Each group duplicates MPI_COMM_WORLD and owns one communication thread that runs its
// collectives one after another in issue order, so they overlap the caller's computation:
// all-reduces as blocking MPI_Allreduce calls (in pieces of at most 16 MiB), the others with
// non-blocking MPI (MPI_Ibcast, ...) polled with MPI_Test, so they can time out. Sends and
// receives run on a second thread: each starts as soon as every collective issued before it
// has finished, and they run concurrently with later ones (and complete while the first
// thread sits in a blocking all-reduce), so matched send/recv pairs never deadlock. Under
// MPI_THREAD_SERIALIZED (a program that initialised MPI itself at that level) every MPI call
// holds one lock, so there a blocking all-reduce holds up the rank's other MPI calls, every
// group's, until it returns.
//
// NOTE (inline collectives): waiting on a collective the thread has not started yet, once
// every collective issued before it has finished, runs it on the waiter's own thread instead
// (later ones wait for it, as they would on the thread): a small all-reduce then costs about
// what a blocking MPI_Allreduce costs, without two thread hand-offs or a lock. Such a
// blocking call cannot time out by itself; the communication thread watches it, and one
// still running a second after the timeout is reported on stderr ("allreduce #17 on rank 1
// timed out after ...") before MPI_Abort ends the job.
//
// NOTE (failure): a collective that does not finish within the group's timeout (a peer died,
// skipped it or issued another) cannot be cancelled in MPI. The waiter gets ember::Error
// ("allreduce #17 on rank 1 timed out after 5000 ms ..."), every later call on the group
// throws, and the process must end: left uncaught the error terminates it (non-zero exit,
// and mpirun then stops the other ranks); if the program catches it, destroying the broken
// group calls MPI_Abort(MPI_COMM_WORLD, 1), since MPI_Finalize would wait forever on the
// abandoned collective (and at exit, a job holding such a collective aborts rather than
// finalises: see detail::mark_mpi_job_broken). Any other failure of an issued operation on
// one rank breaks that rank's group the same way: one that fails before MPI (a staging copy)
// leaves its peers inside the operation, so a later one here would pair with theirs, and
// after an MPI error MPI's state is undefined. Only a fingerprint mismatch, which every rank
// sees, leaves the group in step. When the group breaks, the reason is written to stderr
// ("ember::dist: the mpi process group broke on rank 1: ..."), once: a group destroyed while
// the error unwinds (declared inside the try that catches it) ends the job before the catch
// can print. Destroying a group waits for what was issued; when a
// collective the thread runs (an all-reduce nobody waited on) finishes nothing for the
// timeout plus a second, it is reported like a timed-out one and MPI_Abort ends the job.
// A rank whose group breaks or times out first writes its flight records and asks every rank
// of the job for theirs over the job's store (detail::mpi_job_store, made with the world
// group: one broadcast of rank 0's address), the hung rank's included, and gathers them into
// its own flight-recorder folder, waiting at most 3 s for them, before the job ends.
//
// Subgroups (new_group) get a communicator of their own from MPI_Comm_create_group over the
// members (only they call MPI; the others go on at once) and their own two threads, so they
// run independently of the parent and of each other. That call has no timeout: a member that
// never calls new_group holds the others there (and under MPI_THREAD_SERIALIZED, where it
// holds every MPI call of the rank meanwhile, wait for the parent's operations first).
#pragma once

#include <memory>
#include <vector>

#include <ember/dist/process_group.h>

namespace ember::dist {

class MpiProcessGroup : public BackendGroup {
 public:
  // Collective over all MPI ranks: initialises MPI when needed (see init_process_group) and
  // duplicates MPI_COMM_WORLD. `local_rank` < 0 asks MPI (ranks sharing this node).
  explicit MpiProcessGroup(ProcessGroupOptions options = {}, int local_rank = -1);
  ~MpiProcessGroup() override;
  MpiProcessGroup(const MpiProcessGroup&) = delete;
  MpiProcessGroup& operator=(const MpiProcessGroup&) = delete;

  std::string backend() const override { return "mpi"; }

  struct State;

 private:
  explicit MpiProcessGroup(std::shared_ptr<State> state);
  WorkHandle submit(const CollectiveRequest& request) override;
  void check_devices(const CollectiveRequest& request) const override;
  // A communicator over the members (MPI_Comm_create_group over MPI_COMM_WORLD), with its own
  // threads, as any MpiProcessGroup: only the members call MPI.
  std::shared_ptr<ProcessGroup> make_subgroup(const SubgroupSpec& spec) override;
  std::shared_ptr<State> state_;
};

}  // namespace ember::dist

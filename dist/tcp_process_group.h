// The TCP backend: CPU tensors between processes over plain sockets, for jobs launched
// without mpirun (torchrun-style RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT).
//
// Bootstrap: rank 0 serves a TcpStore on master_addr:master_port; every rank listens on an
// ephemeral port of the address it reaches the master from, publishes it in the store, and
// connects a full mesh, two connections per pair: one for collectives, one for send/recv, so
// the two can never be confused. Every message carries a header (collective or send, its
// sequence number, ring step or tag, dtype, byte count) that the receiver checks: ranks that
// issue different collectives get an ember::Error naming both, never mixed-up data.
//
// The queue, threads, inline runs, timeouts and broken state are detail::Scheduler's
// (dist/detail/scheduler.h), shared with the MPI backend; this file holds the transport.
// Collectives run one after another in issue order on one communication thread: ring
// reduce-scatter + ring allgather for allreduce (in 1 MiB chunks), ring allgather, ring
// reduce_scatter, broadcast and reduce straight between the root and every rank, barrier as
// a one-element allreduce. Point-to-point operations run on a second thread, concurrently
// with later collectives, each starting once every collective issued before it has finished
// (as on the MPI backend); a message nobody has asked for yet is buffered, so matched
// send/recv pairs never deadlock. Sums of f16 and bf16 are formed in float and rounded once
// per step.
//
// NOTE (failure): an operation that does not finish within the group's timeout, or whose peer
// closed its connection, raises ember::Error naming the operation, its sequence number and the
// rank; the group is then broken: its connections are shut down (so peers waiting on this rank
// fail at once instead of at their own timeout) and every later call throws; the reason is
// written to stderr once ("ember::dist: the tcp process group broke on rank 1: ..."), in case
// the launcher stops this process before it reports the error. Unlike MPI, the process can go
// on and exit normally.
//
// Subgroups (new_group) connect a mesh of their own among their members, met through the
// same store under keys unique to the subgroup, with their own threads; non-members take no
// part.
#pragma once

#include <memory>
#include <string>

#include <ember/dist/process_group.h>

namespace ember::dist {

class TcpProcessGroup : public BackendGroup {
 public:
  // Collective over the `size` processes of the job. The TcpStore at master_addr:master_port
  // is made once per process (rank 0 serves it until every rank that used it has exited, or
  // a short grace passes) and shared by every group made over it: the n-th group each rank
  // makes meets the n-th group of every other rank. With a job secret (EMBER_JOB_SECRET, see
  // README "Security") every store and mesh connection proves it; connections to this rank's
  // listener that fail that or greet wrongly are dropped and logged, and the listener keeps
  // waiting for the ranks it expects. Throws ember::Error when a peer cannot be reached
  // within the timeout. CPU tensors only: a CUDA tensor is refused with ember::Error (use
  // the NCCL backend).
  TcpProcessGroup(const std::string& master_addr, int master_port, int rank, int size,
                  int local_rank, ProcessGroupOptions options = {});
  ~TcpProcessGroup() override;
  TcpProcessGroup(const TcpProcessGroup&) = delete;
  TcpProcessGroup& operator=(const TcpProcessGroup&) = delete;

  std::string backend() const override { return "tcp"; }

  struct State;

 private:
  explicit TcpProcessGroup(std::shared_ptr<State> state);
  WorkHandle submit(const CollectiveRequest& request) override;
  void check_devices(const CollectiveRequest& request) const override;
  // A mesh of its own among the members, met through the parent's store under keys unique
  // to this subgroup (new_group's number for it under the parent's keys).
  std::shared_ptr<ProcessGroup> make_subgroup(const SubgroupSpec& spec) override;
  std::shared_ptr<State> state_;
};

}  // namespace ember::dist

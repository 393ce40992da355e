// The NCCL backend (CUDA builds only): CUDA tensors on the group's own high-priority stream.
// Each collective waits (an event recorded on the caller's current stream) for the work that
// produced its tensors and runs on the NCCL stream. As in PyTorch, Work::wait() with the
// group's timeout orders the caller's current stream after the collective and returns without
// holding the host; a watchdog thread checks every operation in flight and, on a timeout or an
// asynchronous NCCL error, prints an error naming the collective, its number and the rank and
// ends the process with status 1; its deadline counts from the issue. wait() with an explicit
// timeout, a barrier's wait, and every wait under ProcessGroupOptions::blocking_wait hold the
// host until the collective is done, polling its completion event and ncclCommGetAsyncError
// (the watchdog leaves that collective to them): on a timeout or an error the communicator is
// aborted, the Work throws ember::Error naming the collective, its number and the rank, and
// every later call on the group throws. Under blocking_wait the watchdog ends the process only
// when the group is destroyed with an operation nobody waited on that failed or is past its
// deadline. A failed NCCL call breaks the group the same way: the other ranks went on.
// Either way the reason reaches stderr first: the watchdog's message, or, when a wait breaks
// the group, "ember::dist: the nccl process group broke on rank 1: ..." (once).
//
// With a side channel (init_process_group gives one: the store the ranks met at, or under
// mpirun the job's store, detail::mpi_job_store), every
// collective's fingerprint is compared beside it, off the issuing thread: where the ranks
// issued different collectives, or a rank waits in one that a peer left the group before
// (destroy_process_group, the group's destruction), the group breaks within milliseconds and
// every wait on it throws ember::Error naming each rank's call, or who left after which
// collective. A rank whose peer never issues the collective fails at the timeout, naming it.
// EMBER_DIST_DEBUG=1 (options.debug) adds a check before each collective, by a blocking NCCL
// all-gather: it costs a host round trip per collective, but finds a mismatch before the
// collective is issued, so the group stays usable (the FingerprintMismatch is thrown on every
// rank), and it works without a side channel too.
#pragma once

#include <array>
#include <memory>
#include <string>

#include <ember/config.h>
#include <ember/dist/process_group.h>

#if EMBER_WITH_CUDA

namespace ember::dist {

class TcpStore;

class NcclProcessGroup : public BackendGroup {
 public:
  using UniqueId = std::array<char, 128>;  // ncclUniqueId's bytes
  // Made once (by rank 0) and handed to every rank by the launcher's channel (MPI or TcpStore).
  static UniqueId create_unique_id();

  // Where the ranks compare their collectives and say goodbye (detail/store_check.h): the
  // store they met at, and a key prefix of this group's that every rank passes alike.
  // Without one (a group made by hand, or an MPI job whose ranks could not reach rank 0's
  // store) only EMBER_DIST_DEBUG's check compares them.
  struct SideChannel {
    std::shared_ptr<TcpStore> store;
    std::string prefix;
  };

  // Collective over all `size` ranks: each passes the same id and uses CUDA device `device`.
  // Initialisation itself is bounded by options.timeout.
  NcclProcessGroup(int rank, int size, int local_rank, int device, const UniqueId& id,
                   ProcessGroupOptions options = {}, SideChannel side = {});
  ~NcclProcessGroup() override;
  NcclProcessGroup(const NcclProcessGroup&) = delete;
  NcclProcessGroup& operator=(const NcclProcessGroup&) = delete;

  std::string backend() const override { return "nccl"; }
  int device() const;
  Device tensor_device() const override;
  // Collectives and send/recv as ProcessGroup's, on CUDA tensors of device(). NCCL matches
  // point-to-point operations by order, not tag: `tag` must be 0. Each runs on the group's
  // one stream in issue order, so two ranks that both send to each other before they
  // receive may wait on each other (until the timeout), whatever the size: order the
  // exchange (the lower rank sends first, the higher receives first).

  struct State;

 private:
  NcclProcessGroup(std::shared_ptr<State> state, int local_rank, SideChannel side);
  WorkHandle submit(const CollectiveRequest& request) override;
  void check_devices(const CollectiveRequest& request) const override;
  // ncclCommSplit of this group's communicator: every rank of it takes part (see there).
  std::shared_ptr<ProcessGroup> make_subgroup(const SubgroupSpec& spec) override;
  std::shared_ptr<State> state_;
  SideChannel side_;  // subgroups compare over it too, under their own prefixes
};

}  // namespace ember::dist

#endif  // EMBER_WITH_CUDA

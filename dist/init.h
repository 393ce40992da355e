// init_process_group(): one call at the top of a training program makes the process group
// the launcher set up, whichever launcher it was, and makes it the default group that the
// torch.distributed-style free functions use (see api.h). destroy_process_group() ends it.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <ember/dist/process_group.h>
#include <ember/tensor/device.h>

namespace ember::dist {

// What the launcher told this process. Precedence: mpirun's OMPI_COMM_WORLD_RANK / _SIZE /
// _LOCAL_RANK, then torchrun-style RANK / WORLD_SIZE / LOCAL_RANK (torchrun inside a Slurm
// allocation sets both kinds, and its own are the ones that describe the job), then Slurm's
// SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; none of them: a single process.
// MASTER_ADDR / MASTER_PORT are read whenever set. Throws ember::Error on a malformed,
// incomplete or inconsistent set of variables.
struct LaunchEnv {
  std::string launcher = "none";  // "mpirun", "torchrun", "slurm" or "none"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr{};  // empty when unset
  int master_port = 0;        // 0 when unset
};
LaunchEnv read_launch_env();

struct InitOptions {
  // "auto": "single" for one process started without a launcher; "nccl" on CUDA devices;
  // on the CPU "mpi" when MPI launched the job (mpirun, or srun without MASTER_ADDR) and "tcp"
  // otherwise (torchrun-style variables, or srun with MASTER_ADDR set). Or by name:
  //   "tcp", "gloo"  ember's CPU backend over TCP (gloo is PyTorch's name for the CPU backend;
  //                  the group reports "tcp"). Like PyTorch's gloo it runs under any launcher:
  //                  under mpirun or srun it takes their ranks and meets at MASTER_ADDR /
  //                  MASTER_PORT (env://), which must then be set.
  //   "mpi"          CPU tensors over MPI (mpirun, or srun with PMI).
  //   "nccl"         CUDA tensors, one GPU per process.
  //   "single"       one process, no communication.
  // Another name is an ember::Error listing these.
  std::string backend = "auto";
  // Where the tensors live; unset: the CPU for "tcp" / "gloo", else CUDA when a GPU is visible,
  // else the CPU. With CUDA each process is bound to GPU local_rank (made its current device).
  std::optional<Device> device{};
  ProcessGroupOptions group{};
  // Where the ranks meet, as torch.distributed's init_method (TCP and NCCL backends):
  //   "env://"           MASTER_ADDR:MASTER_PORT; rank / world_size from the launcher unless
  //                      both are given here.
  //   "tcp://HOST:PORT"  rank 0 serves the store on HOST:PORT; rank and world_size required.
  //   "file:///PATH"     rank 0 serves the store on a free port of its host (MASTER_ADDR when
  //                      set, else its host name) and publishes the address, its world size and
  //                      a fresh nonce in PATH atomically; the other ranks wait for the file,
  //                      and use it once the store there answers with the file's nonce. Rank 0
  //                      removes the file once every rank has joined (or the start failed), so
  //                      a file found at the start is stale, from a run that died starting:
  //                      rank 0 refuses it, and the others give up at the timeout naming it.
  //                      rank and world_size required; PATH must be shared by all ranks.
  // Every rank checks at the store that it agrees with rank 0's world size and that no other
  // process has its rank, within the timeout. Under mpirun the ranks are mpirun's (rank /
  // world_size, when given, must equal them); the MPI backend and NCCL meet over MPI and do not
  // use the URL, the TCP backend ("gloo") meets at it.
  std::string init_method = "env://";
  int rank = -1;        // -1: from the launcher
  int world_size = -1;  // -1: from the launcher
  // The rendezvous's and the group's timeout; unset: group.timeout.
  std::optional<std::chrono::milliseconds> timeout{};
};

// Builds the process group for this job and makes it the default group, which the free
// functions of <ember/dist/api.h> (all_reduce, barrier, get_rank, ...) use, as in
// torch.distributed. Bootstrap follows the launcher: MPI ranks meet over MPI, and rank 0 serves
// the job a TcpStore on a free port whose address travels over MPI_Bcast (with NCCL's unique
// id; see detail::mpi_job_store): NCCL compares its collectives and says goodbye there, and
// every rank answers requests for its flight records there. Otherwise rank 0 serves a
// TcpStore on MASTER_ADDR:MASTER_PORT, where the TCP backend's ranks exchange their addresses
// and NCCL's unique id is published. MPI is initialised (MPI_THREAD_MULTIPLE) only when a
// backend needs it.
// Returns the default group too, for code that passes the group around (DDP, SyncBatchNorm).
// A second call while a default group exists throws ember::Error, as PyTorch does; after
// destroy_process_group() it may be called again. A call that throws leaves none.
std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options = {});

// True between init_process_group() and destroy_process_group().
bool is_initialized();

// The default group; ember::Error when there is none (call init_process_group() first).
// Every dist API that takes a group has a form without one that uses this group, as
// torch.distributed's group=None does, and fails with the same error before
// init_process_group().
std::shared_ptr<ProcessGroup> get_default_group();

// Releases the default group (ember::Error when there is none). The group itself ends once
// nobody holds it: at once unless the caller kept init_process_group()'s result, or a DDP
// wrapper still holds it; its destructor waits for the collectives issued on it. One never
// destroyed is released when the program exits (before MPI is finalised).
void destroy_process_group();

}  // namespace ember::dist

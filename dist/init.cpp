#include "init.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <span>
#include <utility>

#include <ember/config.h>
#include <ember/tensor/cuda.h>

#include "detail/default_group.h"
#include "detail/mpi_runtime.h"
#include "detail/rendezvous.h"
#include "detail/shared_store.h"
#include "mpi_process_group.h"
#include "single_process_group.h"
#include "tcp_process_group.h"
#if EMBER_WITH_CUDA
#include "nccl_process_group.h"
#endif

namespace ember::dist {

namespace {

constexpr const char* kOp = "init_process_group";

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

int parse_int(const char* name, const char* text) {
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  EMBER_CHECK(errno == 0 && end != text && *end == '\0' && value >= INT32_MIN && value <= INT32_MAX,
              kOp, name, "=\"", text, "\" is not an integer");
  return static_cast<int>(value);
}

// Reads one launcher's triple; false when none of its variables is set.
bool read_triple(LaunchEnv& out, const char* launcher, const char* rank, const char* size,
                 const char* local) {
  const char* r = env(rank);
  const char* s = env(size);
  const char* l = env(local);
  if (r == nullptr && s == nullptr) return false;
  EMBER_CHECK(r != nullptr && s != nullptr, kOp, r != nullptr ? rank : size, " is set but ",
              r != nullptr ? size : rank, " is not (", launcher, "-style launch)");
  out.launcher = launcher;
  out.rank = parse_int(rank, r);
  out.world_size = parse_int(size, s);
  EMBER_CHECK(out.world_size >= 1, kOp, size, "=", out.world_size, " must be at least 1");
  EMBER_CHECK(out.rank >= 0 && out.rank < out.world_size, kOp, rank, "=", out.rank,
              " is not in [0, ", out.world_size, ") (", size, "=", out.world_size, ")");
  EMBER_CHECK(l != nullptr || out.world_size == 1, kOp, local, " is not set (", rank, "=", out.rank,
              ", ", size, "=", out.world_size, "); it picks the GPU of each process on a node");
  out.local_rank = l != nullptr ? parse_int(local, l) : 0;
  EMBER_CHECK(out.local_rank >= 0 && out.local_rank < out.world_size, kOp, local, "=",
              out.local_rank, " is not in [0, ", out.world_size, ")");
  return true;
}

// "gloo", PyTorch's CPU backend, is ember's TCP backend.
std::string canonical_backend(const std::string& name) { return name == "gloo" ? "tcp" : name; }

// The TCP backend moves CPU tensors: asked for by name it keeps them there even where a GPU
// is visible (as PyTorch's gloo does).
Device pick_device(const InitOptions& options) {
  if (options.device) return *options.device;
  if (canonical_backend(options.backend) == "tcp") return kCPU;
  return cuda::is_available() ? cuda_device(0) : kCPU;
}

// True when MPI launched the job: mpirun, or srun (through PMI) without MASTER_ADDR.
bool launched_by_mpi(const LaunchEnv& launch) {
  return launch.launcher == "mpirun" || (launch.launcher == "slurm" && launch.master_addr.empty());
}

std::string pick_backend(const InitOptions& options, const LaunchEnv& launch, Device device) {
  const std::string b = canonical_backend(options.backend);
  EMBER_CHECK(b == "auto" || b == "mpi" || b == "nccl" || b == "tcp" || b == "single", kOp,
              "unknown backend \"", options.backend,
              "\"; expected \"tcp\" or \"gloo\" (CPU tensors over TCP, under any launcher; "
              "gloo is PyTorch's name for it), \"mpi\" (CPU tensors over MPI, under mpirun or "
              "srun), \"nccl\" (CUDA tensors, one GPU per process), \"single\" (one process, "
              "no communication) or \"auto\" (single without a launcher, nccl on CUDA, mpi under "
              "an MPI launcher, tcp otherwise)");
  if (b != "auto") return b;
  if (launch.launcher == "none") return "single";
  if (device.is_cuda()) return "nccl";
  return launched_by_mpi(launch) ? "mpi" : "tcp";
}

// The default group (init_process_group to destroy_process_group). Never destroyed itself:
// the handler that releases the group at exit may run after static destructors.
struct DefaultGroup {
  std::mutex mutex;                     // guards group
  std::mutex init_mutex;                // one init_process_group at a time
  std::shared_ptr<ProcessGroup> group;  // null when there is none
};
DefaultGroup& default_group() {
  static auto* instance = new DefaultGroup;
  return *instance;
}

// Releases the default group at exit (registered after each init, so it runs before the
// MPI finaliser and the CUDA runtime's teardown, both set up earlier).
void release_default_group_at_exit() {
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(default_group().mutex);
    group = std::move(default_group().group);
  }
  // Destroyed here, outside the lock.
}

std::shared_ptr<ProcessGroup> make_process_group(const InitOptions& options);

}  // namespace

LaunchEnv read_launch_env() {
  LaunchEnv out;
  if (!read_triple(out, "mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                   "OMPI_COMM_WORLD_LOCAL_RANK") &&
      !read_triple(out, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK")) {
    read_triple(out, "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
  }
  const char* addr = env("MASTER_ADDR");
  const char* port = env("MASTER_PORT");
  if (addr != nullptr) out.master_addr = addr;
  if (port != nullptr) {
    out.master_port = parse_int("MASTER_PORT", port);
    EMBER_CHECK(out.master_port > 0 && out.master_port <= 65535, kOp,
                "MASTER_PORT=", out.master_port, " is not a TCP port");
  }
  return out;
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  DefaultGroup& d = default_group();
  std::lock_guard<std::mutex> init_lock(d.init_mutex);
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    EMBER_CHECK(d.group == nullptr, kOp, "the default process group is already initialized (",
                d.group->backend(), " backend, rank ", d.group->rank(), " of ", d.group->size(),
                "); call destroy_process_group() first");
  }
  std::shared_ptr<ProcessGroup> group = make_process_group(options);
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    d.group = group;
  }
  std::atexit(release_default_group_at_exit);
  return group;
}

bool is_initialized() {
  DefaultGroup& d = default_group();
  std::lock_guard<std::mutex> lock(d.mutex);
  return d.group != nullptr;
}

std::shared_ptr<ProcessGroup> detail::default_group_for(const char* op) {
  DefaultGroup& d = default_group();
  std::lock_guard<std::mutex> lock(d.mutex);
  EMBER_CHECK(d.group != nullptr, op,
              "the default process group is not initialized; call init_process_group() first");
  return d.group;
}

std::shared_ptr<ProcessGroup> get_default_group() {
  return detail::default_group_for("get_default_group");
}

void destroy_process_group() {
  DefaultGroup& d = default_group();
  std::shared_ptr<ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    EMBER_CHECK(d.group != nullptr, "destroy_process_group",
                "the default process group is not initialized; call init_process_group() first");
    group = std::move(d.group);
  }
  // The group ends here, outside the lock, unless somebody else still holds it.
}

namespace {

std::shared_ptr<ProcessGroup> make_process_group(const InitOptions& user_options) {
  InitOptions options = user_options;
  if (options.timeout) options.group.timeout = *options.timeout;
  const detail::InitMethod method = detail::parse_init_method(options.init_method);
  const LaunchEnv launch =
      detail::resolve_identity(method, options.rank, options.world_size, read_launch_env());
  const Device device = pick_device(options);
  const std::string backend = pick_backend(options, launch, device);
  if (device.is_cuda()) {
    const int count = cuda::device_count();
    EMBER_CHECK(launch.local_rank < count, kOp, "local rank ", launch.local_rank,
                " has no GPU of its own: ", count, " visible on this node");
    cuda::set_device(launch.local_rank);
  }
  // Where TCP and NCCL ranks meet (not under MPI's own bootstrap).
  const auto meet = [&](const char* name) -> detail::StoreAddress {
    if (launch.world_size == 1 && method.scheme == "env") {
      return {launch.master_addr, launch.master_port};
    }
    return detail::rendezvous(method, launch, name, options.group.timeout);
  };

  if (backend == "single") {
    EMBER_CHECK(launch.world_size == 1, kOp, "the single-process backend needs world size 1 but ",
                launch.launcher, " launched ", launch.world_size, " processes");
    return std::make_shared<SingleProcessGroup>();
  }

  if (backend == "mpi") {
    EMBER_CHECK(launch.launcher != "torchrun", kOp,
                "the MPI backend needs an MPI launcher (mpirun, or srun with PMI), but this job "
                "was launched torchrun-style (RANK/WORLD_SIZE); use the tcp backend (the default "
                "for such launches on the CPU), nccl on GPUs, or launch with mpirun");
    auto group = std::make_shared<MpiProcessGroup>(
        options.group, launch.launcher == "none" ? -1 : launch.local_rank);
    EMBER_CHECK(launch.launcher == "none" ||
                    (group->rank() == launch.rank && group->size() == launch.world_size),
                kOp, "MPI sees rank ", group->rank(), " of ", group->size(), " but ",
                launch.launcher, " set rank ", launch.rank, " of ", launch.world_size);
    return group;
  }

  if (backend == "tcp") {
    EMBER_CHECK(device.is_cpu(), kOp, "the ", options.backend,
                " backend moves CPU tensors but the device is ", device,
                "; use the nccl backend on GPUs");
    // Under mpirun the ranks are mpirun's, but TCP ranks still meet at rank 0's store, as
    // PyTorch's gloo does under any launcher.
    EMBER_CHECK(!launched_by_mpi(launch) || launch.world_size == 1 || method.scheme != "env" ||
                    (!launch.master_addr.empty() && launch.master_port > 0),
                kOp, "the ", options.backend, " backend meets at MASTER_ADDR:MASTER_PORT under ",
                launch.launcher,
                " too, and they are not set: set both (rank 0's host and a free port), or use "
                "backend \"mpi\" (or \"auto\"), which meets over MPI");
    const detail::StoreAddress store = meet("tcp");
    return std::make_shared<TcpProcessGroup>(store.host, store.port, launch.rank, launch.world_size,
                                             launch.local_rank, options.group);
  }

  // NCCL.
  EMBER_CHECK(device.is_cuda(), kOp, "the NCCL backend needs a CUDA device, got ", device);
#if EMBER_WITH_CUDA
  NcclProcessGroup::UniqueId id{};
  NcclProcessGroup::SideChannel side;
  // The n-th NCCL group of every rank meets under the same keys of the store, and compares its
  // collectives and says goodbye there (the group's side channel).
  const auto side_channel = [&](const std::shared_ptr<TcpStore>& store) {
    const int64_t group = store->add("ember/nccl/groups/" + std::to_string(launch.rank), 1);
    side = {store, "ember/nccl/" + std::to_string(group) + "/check"};
    return "ember/nccl/" + std::to_string(group) + "/id";
  };
  // Over MPI under mpirun (a world of one too: it gets the job's store as any other), and under
  // srun with PMI when there are peers.
  const bool over_mpi =
      launched_by_mpi(launch) && (launch.world_size > 1 || launch.launcher == "mpirun");
  if (over_mpi) {
    detail::ensure_mpi_initialized();
    int mpi_rank = 0, mpi_size = 0;
    detail::check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank), "MPI_Comm_rank");
    detail::check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size), "MPI_Comm_size");
    EMBER_CHECK(mpi_rank == launch.rank && mpi_size == launch.world_size, kOp, "MPI sees rank ",
                mpi_rank, " of ", mpi_size, " but ", launch.launcher, " set rank ", launch.rank,
                " of ", launch.world_size);
    if (launch.rank == 0) id = NcclProcessGroup::create_unique_id();
    // The id travels with the job store's address, in one broadcast.
    auto store = detail::mpi_job_store(MPI_COMM_WORLD, std::span<char>(id.data(), id.size()),
                                       options.group.timeout);
    if (store != nullptr) side_channel(store);
  } else if (launch.world_size == 1) {
    id = NcclProcessGroup::create_unique_id();
  } else {
    const detail::StoreAddress address = meet("NCCL");
    // The store TCP groups use too (rank 0 serves MASTER_PORT once per process); it lives
    // until exit, so no rank can lose it before every rank has read the id. With a job secret
    // (EMBER_JOB_SECRET) only processes that prove it can read or replace the id.
    auto store = detail::shared_store(address.host, address.port, launch.world_size, launch.rank,
                                      options.group.timeout);
    const std::string key = side_channel(store);
    if (launch.rank == 0) {
      id = NcclProcessGroup::create_unique_id();
      store->set(key, std::string(id.data(), id.size()));
    }
    const std::string bytes = store->get(key);
    EMBER_CHECK(bytes.size() == id.size(), kOp, "the NCCL unique id from the store has ",
                bytes.size(), " bytes, expected ", id.size());
    std::memcpy(id.data(), bytes.data(), id.size());
  }
  return std::make_shared<NcclProcessGroup>(launch.rank, launch.world_size, launch.local_rank,
                                            launch.local_rank, id, options.group, std::move(side));
#else
  throw Error("init_process_group: the NCCL backend needs ember built with CUDA");
#endif
}

}  // namespace

}  // namespace ember::dist

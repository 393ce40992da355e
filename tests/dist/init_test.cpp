// init_process_group's reading of the launchers' variables, set in this process.
#include <cstdlib>
#include <map>

#include <ember/dist/dist.h>

#include "dist_test_util.h"
#include "test_util.h"

namespace ember::dist {
namespace {

const char* const kVars[] = {"OMPI_COMM_WORLD_RANK",
                             "OMPI_COMM_WORLD_SIZE",
                             "OMPI_COMM_WORLD_LOCAL_RANK",
                             "RANK",
                             "WORLD_SIZE",
                             "LOCAL_RANK",
                             "SLURM_PROCID",
                             "SLURM_NTASKS",
                             "SLURM_LOCALID",
                             "MASTER_ADDR",
                             "MASTER_PORT"};

// Clears every launcher variable (mpirun's too, when the suite runs under it) for a scope,
// sets the given ones, and puts everything back afterwards.
class ScopedLaunchEnv {
 public:
  explicit ScopedLaunchEnv(const std::map<std::string, std::string>& values) {
    for (const char* name : kVars) {
      if (const char* v = std::getenv(name)) saved_[name] = v;
      ::unsetenv(name);
    }
    for (const auto& [name, v] : values) ::setenv(name.c_str(), v.c_str(), 1);
  }
  ~ScopedLaunchEnv() {
    for (const char* name : kVars) ::unsetenv(name);
    for (const auto& [name, v] : saved_) ::setenv(name.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

TEST(LaunchEnv, NoLauncherIsASingleProcess) {
  ScopedLaunchEnv env(std::map<std::string, std::string>{});
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.launcher, "none");
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.local_rank, 0);
  InitOptions options;
  options.device = kCPU;
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(options);
  EXPECT_EQ(pg->backend(), "single");
  EXPECT_EQ(pg->size(), 1);
}

TEST(LaunchEnv, Mpirun) {
  ScopedLaunchEnv env({{"OMPI_COMM_WORLD_RANK", "3"},
                       {"OMPI_COMM_WORLD_SIZE", "8"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                       {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "1"}});
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
}

TEST(LaunchEnv, Slurm) {
  ScopedLaunchEnv env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "2"}});
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_TRUE(e.master_addr.empty());
}

TEST(LaunchEnv, TorchrunWinsOverTheSlurmAllocationAroundIt) {
  ScopedLaunchEnv env({{"RANK", "1"},
                       {"WORLD_SIZE", "4"},
                       {"LOCAL_RANK", "1"},
                       {"MASTER_ADDR", "node7"},
                       {"MASTER_PORT", "29500"},
                       {"SLURM_PROCID", "0"},
                       {"SLURM_NTASKS", "1"},
                       {"SLURM_LOCALID", "0"}});
  const LaunchEnv e = read_launch_env();
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "node7");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, InconsistentOrMissingVariables) {
  {
    ScopedLaunchEnv env(std::map<std::string, std::string>{{"RANK", "0"}});
    EXPECT_EMBER_ERROR(read_launch_env(), "RANK is set but WORLD_SIZE is not");
  }
  {
    ScopedLaunchEnv env({{"RANK", "two"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}});
    EXPECT_EMBER_ERROR(read_launch_env(), "RANK=\"two\" is not an integer");
  }
  {
    ScopedLaunchEnv env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}});
    EXPECT_EMBER_ERROR(read_launch_env(), "RANK=4 is not in [0, 4)");
  }
  {
    ScopedLaunchEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
    EXPECT_EMBER_ERROR(read_launch_env(), "LOCAL_RANK is not set");
  }
  {
    ScopedLaunchEnv env({{"SLURM_NTASKS", "0"}, {"SLURM_PROCID", "0"}});
    EXPECT_EMBER_ERROR(read_launch_env(), "SLURM_NTASKS=0 must be at least 1");
  }
  {
    ScopedLaunchEnv env(std::map<std::string, std::string>{{"MASTER_PORT", "70000"}});
    EXPECT_EMBER_ERROR(read_launch_env(), "MASTER_PORT=70000 is not a TCP port");
  }
}

TEST(LaunchEnv, BackendChoiceErrors) {
  InitOptions options;
  options.device = kCPU;
  {
    ScopedLaunchEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
    options.backend = "single";
    EXPECT_EMBER_ERROR(init_process_group(options),
                       "the single-process backend needs world size 1 but torchrun launched 2");
    options.backend = "auto";  // CPU, torchrun-style: TCP, which needs the master's address
    EXPECT_EMBER_ERROR(init_process_group(options),
                       "MASTER_ADDR and MASTER_PORT must be set (torchrun launch of 2 processes, "
                       "tcp backend)");
    options.backend = "mpi";
    EXPECT_EMBER_ERROR(init_process_group(options), "the MPI backend needs an MPI launcher");
    options.backend = "nccl";
    EXPECT_EMBER_ERROR(init_process_group(options), "the NCCL backend needs a CUDA device");
  }
  {
    // srun with MASTER_ADDR set meets over TCP too (without it, over MPI through PMI).
    ScopedLaunchEnv env({{"SLURM_PROCID", "1"},
                         {"SLURM_NTASKS", "2"},
                         {"SLURM_LOCALID", "1"},
                         {"MASTER_ADDR", "127.0.0.1"}});
    options.backend = "auto";
    EXPECT_EMBER_ERROR(init_process_group(options),
                       "MASTER_ADDR and MASTER_PORT must be set (slurm launch of 2 processes, tcp "
                       "backend)");
  }
  ScopedLaunchEnv env(std::map<std::string, std::string>{});
  options.backend = "nvlink";
  // The message says what each name means.
  for (const char* part :
       {"unknown backend \"nvlink\"; expected \"tcp\" or \"gloo\" (CPU tensors over TCP, under any "
        "launcher; gloo is PyTorch's name for it)",
        "\"mpi\" (CPU tensors over MPI, under mpirun or srun)",
        "\"nccl\" (CUDA tensors, one GPU per process)",
        "\"single\" (one process, no communication)", "\"auto\" (single without a launcher"})
    EXPECT_EMBER_ERROR(init_process_group(options), part);
}

// backend = "gloo", PyTorch's name for the CPU backend, is ember's TCP backend, which runs
// under any launcher; it keeps tensors on the CPU even where a GPU is visible.
TEST(LaunchEnv, GlooIsTheTcpBackend) {
  InitOptions options;  // no device: gloo's is the CPU
  options.backend = "gloo";
  {
    ScopedLaunchEnv env(std::map<std::string, std::string>{});
    testing::DefaultGroupGuard guard;
    auto pg = init_process_group(options);
    EXPECT_EQ(pg->backend(), "tcp");
    EXPECT_EQ(get_backend(), "tcp");
    EXPECT_EQ(pg->size(), 1);
  }
  {
    ScopedLaunchEnv env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}});
    EXPECT_EMBER_ERROR(init_process_group(options),
                       "MASTER_ADDR and MASTER_PORT must be set (torchrun launch of 2 processes, "
                       "tcp backend)");
  }
  {
    // Under mpirun, as PyTorch's gloo, it meets at MASTER_ADDR:MASTER_PORT.
    ScopedLaunchEnv env({{"OMPI_COMM_WORLD_RANK", "0"},
                         {"OMPI_COMM_WORLD_SIZE", "2"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}});
    EXPECT_EMBER_ERROR(init_process_group(options),
                       "init_process_group: the gloo backend meets at MASTER_ADDR:MASTER_PORT "
                       "under mpirun too, and they are not set: set both (rank 0's host and a "
                       "free port), or use backend \"mpi\" (or \"auto\"), which meets over MPI");
  }
  EXPECT_FALSE(is_initialized());
}

// The same in the job that launched the suite: under mpirun or srun (with MASTER_ADDR and
// MASTER_PORT set here, as a gloo user sets them), torchrun-style or alone, gloo gives a
// working TCP group over the launcher's ranks.
TEST(LaunchEnv, GlooWorksUnderEveryLauncher) {
  const LaunchEnv launch = read_launch_env();
  std::map<std::string, std::string> master;
  if (launch.launcher != "none" && launch.master_addr.empty()) {
    // mpirun or srun: rank 0 picks the port; MPI tells the others.
    auto world = testing::world();
    Tensor port = from_vector<int64_t>({world->rank() == 0 ? testing::free_port() : 0}, {1});
    world->broadcast(port, 0)->wait();
    master = {{"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port.item<int64_t>())}};
  }
  for (const auto& [name, value] : master) ::setenv(name.c_str(), value.c_str(), 1);
  {
    InitOptions options = testing::cpu_init();
    options.backend = "gloo";
    testing::DefaultGroupGuard guard;
    auto pg = init_process_group(options);
    EXPECT_EQ(pg->backend(), "tcp");
    EXPECT_EQ(pg->rank(), launch.rank);
    EXPECT_EQ(pg->size(), launch.world_size);
    Tensor t = ones({5}, kI32);
    all_reduce(t);
    ::ember::testing::expect_close(t, full({5}, launch.world_size, kI32));
  }
  for (const auto& [name, value] : master) ::unsetenv(name.c_str());

  // Under mpirun with init_method tcp://: the ranks meet at the URL's address.
  if (launch.launcher == "mpirun" && launch.master_addr.empty()) {
    auto world = testing::world();
    Tensor port = from_vector<int64_t>({world->rank() == 0 ? testing::free_port() : 0}, {1});
    world->broadcast(port, 0)->wait();
    InitOptions options = testing::cpu_init();
    options.backend = "gloo";
    options.init_method = "tcp://127.0.0.1:" + std::to_string(port.item<int64_t>());
    testing::DefaultGroupGuard guard;
    auto pg = init_process_group(options);
    EXPECT_EQ(pg->backend(), "tcp");
    Tensor t = ones({3}, kI32);
    all_reduce(t);
    ::ember::testing::expect_close(t, full({3}, launch.world_size, kI32));
  }
}

TEST(LaunchEnv, UnderMpirunInitGivesTheMpiGroup) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) GTEST_SKIP() << "not under mpirun";
  InitOptions options;
  options.device = kCPU;
  options.group.timeout = std::chrono::seconds(60);
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(options);
  EXPECT_EQ(pg->backend(), "mpi");
  EXPECT_EQ(pg->rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_RANK")));
  EXPECT_EQ(pg->size(), std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE")));
  EXPECT_EQ(pg->local_rank(), std::atoi(std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")));
  Tensor t = ones({5}, kI32);
  pg->allreduce(t)->wait();
  ::ember::testing::expect_close(t, full({5}, pg->size(), kI32));
}

TEST(LaunchEnv, TorchrunStyleInitGivesTheTcpGroupOnTheCpu) {
  if (std::getenv("RANK") == nullptr || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) {
    GTEST_SKIP() << "not launched torchrun-style";
  }
  InitOptions options;
  options.device = kCPU;
  options.group.timeout = std::chrono::seconds(60);
  testing::DefaultGroupGuard guard;
  auto pg = init_process_group(options);
  EXPECT_EQ(pg->backend(), "tcp");
  EXPECT_EQ(pg->rank(), std::atoi(std::getenv("RANK")));
  EXPECT_EQ(pg->size(), std::atoi(std::getenv("WORLD_SIZE")));
  EXPECT_EQ(pg->local_rank(), std::atoi(std::getenv("LOCAL_RANK")));
  Tensor t = ones({5}, kI32);
  pg->allreduce(t)->wait();
  ::ember::testing::expect_close(t, full({5}, pg->size(), kI32));
}

}  // namespace
}  // namespace ember::dist

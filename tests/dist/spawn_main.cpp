// dist::spawn as a PyTorch user calls torch.multiprocessing.spawn: workers of this test binary
// meet over the TCP backend on loopback and all-reduce; spawn gathers what each returned, and a
// worker that fails ends the others and names its rank. Each test runs in a process of its own
// (ctest runs one --gtest_filter each), since every worker runs the test again up to spawn().
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <ember/dist/detail/supervisor.h>
#include <ember/dist/dist.h>
#include <ember/tensor/cuda.h>
#include <ember/tensor/ops.h>

namespace ember::dist {
namespace {

using Clock = std::chrono::steady_clock;

InitOptions tcp_on_cpu() {
  InitOptions init;
  init.backend = "tcp";
  init.device = kCPU;
  init.timeout = std::chrono::seconds(30);
  return init;
}

// Every rank contributes rank + 1; returns {rank, world size, the sum each rank got, env ranks}.
std::vector<double> all_reduce_job(int rank) {
  init_process_group(tcp_on_cpu());
  Tensor t = full({3}, static_cast<double>(rank + 1), kF64);
  all_reduce(t);
  std::vector<double> out = {static_cast<double>(get_rank()),
                             static_cast<double>(get_world_size())};
  for (double v : t.to_vector<double>()) out.push_back(v);
  out.push_back(std::atof(std::getenv("LOCAL_RANK")));
  out.push_back(std::atof(std::getenv("LOCAL_WORLD_SIZE")));
  destroy_process_group();
  return out;
}

void expect_gathered(int n) {
  const auto results = spawn(n, all_reduce_job);
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  const double sum = n * (n + 1) / 2.0;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(results[r],
              (std::vector<double>{static_cast<double>(r), static_cast<double>(n), sum, sum, sum,
                                   static_cast<double>(r), static_cast<double>(n)}))
        << "rank " << r;
  }
}

TEST(Spawn, GathersResultsFromTwoRanks) { expect_gathered(2); }
TEST(Spawn, GathersResultsFromThreeRanks) { expect_gathered(3); }

// On a GPU node, as mp.spawn is used there: each worker is bound to GPU LOCAL_RANK and meets
// the others over NCCL (the backend init picks for CUDA). As many workers as GPUs, up to 2:
// NCCL wants a GPU of its own per rank, so one GPU runs a world of one.
TEST(Spawn, OneGpuPerWorkerOverNccl) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device visible";
  const int n = std::min(cuda::device_count(), 2);
  const auto results = spawn(n, [](int rank) {
    InitOptions init;
    init.timeout = std::chrono::seconds(60);
    init_process_group(init);
    const int device = cuda::current_device();
    Tensor t = full({4}, static_cast<double>(rank + 1), TensorOptions(kF32, cuda_device(device)));
    all_reduce(t);
    const std::vector<double> out = {get_backend() == "nccl" ? 1.0 : 0.0,
                                     static_cast<double>(device), t.cpu().sum().item<double>()};
    destroy_process_group();
    return out;
  });
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  const double sum = 4.0 * n * (n + 1) / 2.0;
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(results[r], (std::vector<double>{1.0, static_cast<double>(r), sum})) << "rank " << r;
}

TEST(Spawn, ReturnsStringsAndRunsVoidFunctions) {
  const std::string greeting = "hello from rank ";  // computed before spawn: rebuilt in workers
  const auto words = spawn(2, [&](int rank) { return greeting + std::to_string(rank); });
  EXPECT_EQ(words, (std::vector<std::string>{"hello from rank 0", "hello from rank 1"}));
  spawn(2, [](int rank) { EXPECT_GE(rank, 0); });  // a second call in the same program
}

// Rank 1 throws while the others wait in a barrier that only the group timeout (30 s) would
// end: spawn stops them at once and rethrows rank 1's message.
TEST(Spawn, WorkerThatThrowsEndsTheOthersAndNamesItsRank) {
  const auto start = Clock::now();
  try {
    spawn(3, [](int rank) {
      init_process_group(tcp_on_cpu());
      if (rank == 1) throw Error("rank one gives up: loss is nan");
      barrier();
    });
    FAIL() << "spawn did not throw";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("spawn: rank 1 of 3 failed: rank one gives up: loss is nan"),
        std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
}

TEST(Spawn, WorkerKilledBySignalOrExitingNonZeroIsNamed) {
  try {
    spawn(2, [](int rank) {
      if (rank == 1) ::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::seconds(60));
    });
    FAIL() << "spawn did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("was killed by signal 9 (SIGKILL)"), std::string::npos)
        << e.what();
  }
  try {
    spawn(2, [](int rank) {
      if (rank == 0) std::_Exit(3);
    });
    FAIL() << "spawn did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("exited with status 3"), std::string::npos) << e.what();
  }
}

TEST(Spawn, TimeoutStopsAHungJob) {
  SpawnOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.grace = std::chrono::milliseconds(200);
  const auto start = Clock::now();
  EXPECT_THROW(spawn(
                   2, [](int) { std::this_thread::sleep_for(std::chrono::seconds(60)); }, options),
               Error);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
}

// Without a secret of its own, spawn draws one per job and hands it over in a private 0600
// file that is gone once spawn returns; the workers' store then requires it.
TEST(Spawn, WorkersShareAFreshJobSecret) {
  // Read before spawn: in the workers, which run this test again, the variable is set.
  const auto set = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr && value[0] != '\0';
  };
  const bool had_secret = set("EMBER_JOB_SECRET") || set("EMBER_JOB_SECRET_FILE");
  const auto seen = spawn(2, [](int) {
    const char* path = std::getenv("EMBER_JOB_SECRET_FILE");
    if (path == nullptr) throw Error("no EMBER_JOB_SECRET_FILE");
    struct stat st {};
    if (::stat(path, &st) != 0 || (st.st_mode & 0777) != 0600) throw Error("not a 0600 file");
    std::ifstream in(path);
    std::stringstream secret;
    secret << in.rdbuf();
    init_process_group(tcp_on_cpu());  // the store and the mesh handshake with it
    barrier();
    destroy_process_group();
    return std::string(path) + "\n" + secret.str();
  });
  ASSERT_FALSE(had_secret) << "run this test without EMBER_JOB_SECRET(_FILE)";
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], seen[1]);
  const std::string path = seen[0].substr(0, seen[0].find('\n'));
  const std::string secret = seen[0].substr(seen[0].find('\n') + 1);
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << path << " was not removed";
}

// The per-job secret itself: fresh each time, 0600 in a 0700 folder, both gone afterwards.
TEST(SecretFile, IsFreshPrivateAndRemoved) {
  std::string dir;
  {
    detail::SecretFile one;
    detail::SecretFile two;
    EXPECT_NE(one.secret(), two.secret());
    EXPECT_EQ(one.secret().size(), 64u);
    struct stat st {};
    ASSERT_EQ(::stat(one.path().c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    dir = one.path().substr(0, one.path().rfind('/'));
    ASSERT_EQ(::stat(dir.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0700u);
    std::ifstream in(one.path());
    std::string contents;
    in >> contents;
    EXPECT_EQ(contents, one.secret());
  }
  EXPECT_NE(::access(dir.c_str(), F_OK), 0) << dir << " was not removed";
}

TEST(Spawn, RejectsBadArguments) {
  EXPECT_THROW(spawn(0, [](int) {}), Error);
}

}  // namespace
}  // namespace ember::dist

// init_process_group's init_method (env://, tcp://, file://) with explicit rank and world size,
// as a PyTorch user calls torch.distributed.init_process_group: each test forks the ranks of a
// job on loopback (TCP backend, CPU), every rank all-reduces its rank + 1 and checks the sum.
// Jobs that must fail (bad URLs, world sizes that disagree, a stale file://) must fail on every
// rank with a message naming the values, within the timeout. Run alone, not under a launcher.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ember/dist/dist.h>
#include <ember/dist/tcp_store.h>
#include <ember/tensor/cuda.h>

namespace ember::dist {
namespace {

using Clock = std::chrono::steady_clock;

struct RankResult {
  int status = -1;      // exit status; -1: killed
  std::string message;  // the ember::Error a failed rank caught
  double seconds = 0;   // from the job's start to this rank's exit
};

// Forks `n` ranks running `body(rank)`; a rank that throws reports the message and exits 1.
// Every rank is killed after 60 s, so a hang fails the test instead of blocking it.
std::vector<RankResult> run_job(int n, const std::function<void(int)>& body) {
  std::fflush(nullptr);
  const auto start = Clock::now();
  std::vector<pid_t> pids(n);
  std::vector<int> pipes(n);
  for (int rank = 0; rank < n; ++rank) {
    int fds[2];
    if (::pipe(fds) != 0) std::abort();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      int code = 0;
      std::string message;
      try {
        body(rank);
      } catch (const std::exception& e) {
        message = e.what();
        code = 1;
      }
      if (!message.empty() && ::write(fds[1], message.data(), message.size()) < 0) code = 2;
      ::close(fds[1]);
      std::exit(code);
    }
    ::close(fds[1]);
    pids[rank] = pid;
    pipes[rank] = fds[0];
  }
  std::vector<RankResult> results(n);
  std::vector<bool> done(n, false);
  for (int left = n; left > 0;) {
    for (int rank = 0; rank < n; ++rank) {
      if (done[rank]) continue;
      int status = 0;
      if (::waitpid(pids[rank], &status, WNOHANG) != pids[rank]) continue;
      done[rank] = true;
      --left;
      results[rank].status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      results[rank].seconds = std::chrono::duration<double>(Clock::now() - start).count();
      char buffer[4096];
      for (ssize_t got; (got = ::read(pipes[rank], buffer, sizeof(buffer))) > 0;) {
        results[rank].message.append(buffer, static_cast<size_t>(got));
      }
      ::close(pipes[rank]);
    }
    if (left > 0 && Clock::now() - start > std::chrono::seconds(60)) {
      for (int rank = 0; rank < n; ++rank) {
        if (!done[rank]) ::kill(pids[rank], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return results;
}

// A loopback port nothing listens on now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::abort();
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

std::string temp_path(const std::string& name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/ember_init_method_" +
         std::to_string(::getpid()) + "_" + name;
}

InitOptions options(const std::string& url, int rank, int world_size, int timeout_ms = 20000) {
  InitOptions init;
  init.backend = "tcp";
  init.device = kCPU;
  init.init_method = url;
  init.rank = rank;
  init.world_size = world_size;
  init.timeout = std::chrono::milliseconds(timeout_ms);
  return init;
}

// One rank of a working job: the group it gets is rank `rank` of `n`, and all_reduce sums.
void all_reduce_rank(const InitOptions& init, int rank, int n) {
  auto pg = init_process_group(init);
  EMBER_CHECK(get_rank() == rank && get_world_size() == n, "test", "got rank ", get_rank(), " of ",
              get_world_size(), ", expected ", rank, " of ", n);
  Tensor t = full({3}, static_cast<double>(rank + 1));
  all_reduce(t);
  const double expected = n * (n + 1) / 2.0;
  EMBER_CHECK(t.sum().item<double>() == 3 * expected, "test", "all_reduce gave ",
              t.sum().item<double>() / 3, ", expected ", expected);
  barrier();
  destroy_process_group();
}

void expect_all_succeed(const std::vector<RankResult>& results) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 0) << "rank " << rank << ": " << results[rank].message;
  }
}

// Every rank failed, within `limit_s`, and its message contains `needles[rank]`.
void expect_all_fail(const std::vector<RankResult>& results,
                     const std::vector<std::string>& needles, double limit_s) {
  for (size_t rank = 0; rank < results.size(); ++rank) {
    EXPECT_EQ(results[rank].status, 1) << "rank " << rank << ": " << results[rank].message;
    EXPECT_NE(results[rank].message.find(needles[rank]), std::string::npos)
        << "rank " << rank << " said: " << results[rank].message << "\nexpected: " << needles[rank];
    EXPECT_LT(results[rank].seconds, limit_s) << "rank " << rank << ": " << results[rank].message;
  }
}

class InitMethodJob : public ::testing::TestWithParam<int> {};

TEST_P(InitMethodJob, EnvWithExplicitRankAndWorldSize) {
  const int n = GetParam();
  const std::string port = std::to_string(free_port());
  expect_all_succeed(run_job(n, [&](int rank) {
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", port.c_str(), 1);
    all_reduce_rank(options("env://", rank, n), rank, n);
  }));
}

TEST_P(InitMethodJob, Tcp) {
  const int n = GetParam();
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  expect_all_succeed(
      run_job(n, [&](int rank) { all_reduce_rank(options(url, rank, n), rank, n); }));
}

TEST_P(InitMethodJob, FileTwiceOnTheSamePath) {
  const int n = GetParam();
  const std::string path = temp_path("file_np" + std::to_string(n));
  ::unlink(path.c_str());
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);  // rank 0 serves the store on loopback
  for (int run = 0; run < 2; ++run) {
    expect_all_succeed(run_job(n, [&](int rank) {
      // The ranks start in reverse order: rank 0 comes last, the others wait for its file.
      std::this_thread::sleep_for(std::chrono::milliseconds(200 * (n - 1 - rank)));
      all_reduce_rank(options("file://" + path, rank, n), rank, n);
    }));
    EXPECT_NE(::access(path.c_str(), F_OK), 0) << "the rendezvous file outlived the start";
  }
  ::unsetenv("MASTER_ADDR");
}

INSTANTIATE_TEST_SUITE_P(WorldSize, InitMethodJob, ::testing::Values(2, 3));

TEST(InitMethod, BadUrlsAndValuesAreRejectedNamingThem) {
  struct Case {
    std::string url;
    int rank, world_size;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {"foo://127.0.0.1:1234", 0, 2, "init_method \"foo://127.0.0.1:1234\" has an unknown scheme"},
      {"127.0.0.1:1234", 0, 2, "init_method \"127.0.0.1:1234\" is not a URL"},
      {"tcp://127.0.0.1", 0, 2, "init_method \"tcp://127.0.0.1\" has no port"},
      {"tcp://:1234", 0, 2, "init_method \"tcp://:1234\" has no host"},
      {"tcp://127.0.0.1:99999", 0, 2, "port \"99999\" is not a TCP port"},
      {"tcp://127.0.0.1:12ab", 0, 2, "port \"12ab\" is not a TCP port"},
      {"file://", 0, 2, "init_method \"file://\" has no path"},
      {"env://127.0.0.1", 0, 2, "env:// takes nothing after it"},
      {"tcp://127.0.0.1:1234", 2, 2, "rank=2 is not in [0, 2) (world_size=2)"},
      {"tcp://127.0.0.1:1234", 5, 3, "rank=5 is not in [0, 3) (world_size=3)"},
      {"tcp://127.0.0.1:1234", -1, 2, "needs an explicit rank and world_size (got rank=-1"},
      {"file:///tmp/x", 0, -1, "needs an explicit rank and world_size (got rank=0, world_size=-1)"},
      {"tcp://127.0.0.1:1234", 0, 0, "world_size=0 must be at least 1"},
      {"env://", 1, -1, "give both rank and world_size or neither (got rank=1, world_size=-1)"},
  };
  for (const Case& c : cases) {
    const auto start = Clock::now();
    try {
      init_process_group(options(c.url, c.rank, c.world_size));
      ADD_FAILURE() << c.url << " was accepted";
      destroy_process_group();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos)
          << c.url << ": " << e.what() << "\nexpected: " << c.needle;
    }
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(1)) << c.url;
    EXPECT_FALSE(is_initialized());
  }
}

TEST(InitMethod, TcpWorldSizeMismatchIsRefusedOnEveryRank) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  const auto results = run_job(
      2, [&](int rank) { init_process_group(options(url, rank, rank == 0 ? 2 : 3, 3000)); });
  expect_all_fail(
      results,
      {"rank 1 refused to join " + url + " (127.0.0.1:" + url.substr(url.rfind(':') + 1) +
           "): world size mismatch at " + url,
       "world size mismatch at " + url + " (127.0.0.1:" + url.substr(url.rfind(':') + 1) +
           "): rank 0 has world_size=2, rank 1 has world_size=3"},
      10);
}

TEST(InitMethod, TcpRankThatNeverComesTimesOut) {
  const std::string url = "tcp://127.0.0.1:" + std::to_string(free_port());
  const auto results =
      run_job(2, [&](int rank) { init_process_group(options(url, rank, 3, 2000)); });
  // Rank 0 names the missing rank; rank 1 got past the meeting and its group times out too.
  expect_all_fail(results, {"rank 2 did not join " + url, "was not set within 2000 ms"}, 10);
}

TEST(InitMethod, FileWorldSizeMismatchIsRefused) {
  const std::string path = temp_path("mismatch");
  ::unlink(path.c_str());
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  const auto results = run_job(2, [&](int rank) {
    if (rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    init_process_group(options("file://" + path, rank, rank == 0 ? 2 : 3, 3000));
  });
  ::unsetenv("MASTER_ADDR");
  expect_all_fail(results,
                  {"rank 1 did not join file://" + path + " within 3000 ms",
                   "world size mismatch at file://" + path + ": the file has world_size=2"},
                  10);
  EXPECT_NE(::access(path.c_str(), F_OK), 0) << "a failed start left its rendezvous file";
}

TEST(InitMethod, StaleFileIsRefusedNotReused) {
  // What a run that died while starting leaves behind: a complete file naming a store that is
  // gone.
  const std::string path = temp_path("stale");
  {
    std::ofstream out(path);
    out << "ember-rendezvous 1\nworld_size 2\nnonce 0123abcd\nhost 127.0.0.1\nport " << free_port()
        << "\nwriter pid 1 at unix time 0\n";
  }
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  const auto results =
      run_job(2, [&](int rank) { init_process_group(options("file://" + path, rank, 2, 3000)); });
  ::unsetenv("MASTER_ADDR");
  expect_all_fail(results,
                  {"file://" + path + " already exists: a rendezvous file (world size 2",
                   "rank 1 found no live rendezvous at file://" + path + " within 3000 ms"},
                  10);
  EXPECT_NE(results[0].message.find("is stale"), std::string::npos) << results[0].message;
  EXPECT_NE(results[1].message.find("nonce 0123abcd"), std::string::npos) << results[1].message;
  // The user's file is left for them to look at.
  EXPECT_EQ(::access(path.c_str(), F_OK), 0);
  ::unlink(path.c_str());
}

// NCCL meets at the store as the TCP backend does: with a job secret, only processes that prove
// it reach the NCCL unique id. A world of one, so that one GPU runs it (two ranks of one
// communicator need two GPUs). The rank checks for the GPU itself: CUDA stays out of the
// forking test process.
TEST(InitMethod, NcclUniqueIdTravelsOnlyToProcessesWithTheJobSecret) {
  const int port = free_port();
  const auto results = run_job(1, [&](int) {
    if (!cuda::is_available()) std::exit(77);
    ::setenv("EMBER_JOB_SECRET", "the secret of this test's job", 1);
    InitOptions init = options("tcp://127.0.0.1:" + std::to_string(port), 0, 1);
    init.backend = "nccl";
    init.device = cuda_device(0);
    init_process_group(init);
    for (const std::string secret : {"", "a wrong secret"}) {
      std::string refusal;
      try {
        TcpStore intruder("127.0.0.1", port, 1, false, std::chrono::seconds(5),
                          TcpStoreOptions{.secret = secret});
        intruder.set("ember/nccl/1/id", "forged");
      } catch (const Error& e) {
        refusal = e.what();
      }
      EMBER_CHECK(refusal.find("secret") != std::string::npos, "test", "an intruder with ",
                  secret.empty() ? "no secret" : "a wrong secret",
                  " was not refused: ", refusal.empty() ? "it was served" : refusal);
    }
    Tensor t = ones({8}, cuda_device(0));
    all_reduce(t);
    EMBER_CHECK(t.cpu().sum().item<float>() == 8, "test", "all_reduce on NCCL gave ",
                t.cpu().sum().item<float>(), ", expected 8");
    destroy_process_group();
  });
  if (results[0].status == 77) GTEST_SKIP() << "no CUDA device visible";
  expect_all_succeed(results);
}

// Under mpirun (ctest dist_init_method_mpirun_np2): explicit values that repeat mpirun's are
// fine, others are refused naming both; the fork-based tests above are left out there.
TEST(UnderMpirun, ExplicitRankAndWorldSizeMustAgreeWithMpirun) {
  const LaunchEnv launch = read_launch_env();
  if (launch.launcher != "mpirun") GTEST_SKIP() << "run under mpirun";
  InitOptions init;
  init.backend = "mpi";
  init.device = kCPU;
  init.init_method = "tcp://127.0.0.1:1";  // not used under mpirun
  init.rank = (launch.rank + 1) % launch.world_size;
  init.world_size = launch.world_size;
  try {
    init_process_group(init);
    ADD_FAILURE() << "rank " << init.rank << " was accepted on mpirun's rank " << launch.rank;
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("rank=" + std::to_string(init.rank) +
                                   ", world_size=" + std::to_string(launch.world_size) +
                                   " disagree with mpirun's rank " + std::to_string(launch.rank)),
        std::string::npos)
        << e.what();
  }
  init.rank = launch.rank;
  init.world_size = launch.world_size + 1;
  EXPECT_THROW(init_process_group(init), Error);
  init.world_size = launch.world_size;
  auto pg = init_process_group(init);
  EXPECT_EQ(get_rank(), launch.rank);
  EXPECT_EQ(get_world_size(), launch.world_size);
  Tensor t = full({2}, 1.0);
  all_reduce(t);
  EXPECT_EQ(t.sum().item<double>(), 2.0 * launch.world_size);
  destroy_process_group();
}

}  // namespace
}  // namespace ember::dist

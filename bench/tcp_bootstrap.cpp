// Bootstrap time of a 3-rank TCP process group on this host, with and without a job secret
// (EMBER_JOB_SECRET: an HMAC-SHA256 handshake on every store and mesh connection). Each trial
// forks 3 ranks on a fresh MASTER_PORT; a rank's time runs from its start to the end of its
// first barrier (rank 0's store, every rank's store connection, the mesh, one collective),
// and the trial's time is the slowest rank's. Trials alternate between the two settings.
// One JSON line per setting:
//   build/bench/tcp_bootstrap [trials]      (default 20)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ember/dist/dist.h>

#include "bench_util.h"

namespace {

constexpr int kRanks = 3;

// One rank, in a forked child: bootstraps, barriers, writes its seconds to `out`.
[[noreturn]] void rank_main(int rank, int port, bool secret, int out) {
  if (secret) ::setenv("EMBER_JOB_SECRET", "a secret shared by the bench's three ranks", 1);
  double seconds = -1.0;
  try {
    const auto start = std::chrono::steady_clock::now();
    {
      ember::dist::TcpProcessGroup pg("127.0.0.1", port, rank, kRanks, rank);
      pg.barrier()->wait();
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tcp_bootstrap: rank %d: %s\n", rank, e.what());
  }
  const ssize_t put = ::write(out, &seconds, sizeof(seconds));
  std::exit(put == sizeof(seconds) && seconds >= 0 ? 0 : 1);
}

// The slowest rank's bootstrap time of one trial, in seconds; negative when a rank failed.
double trial(bool secret) {
  const int port = ember::bench::free_port();
  int fds[2];
  if (::pipe(fds) != 0) return -1.0;
  std::vector<pid_t> children;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      rank_main(rank, port, secret, fds[1]);
    }
    children.push_back(pid);
  }
  ::close(fds[1]);
  double slowest = 0.0;
  for (int rank = 0; rank < kRanks; ++rank) {
    double seconds = -1.0;
    if (::read(fds[0], &seconds, sizeof(seconds)) != sizeof(seconds) || seconds < 0) slowest = -1;
    if (slowest >= 0) slowest = std::max(slowest, seconds);
  }
  ::close(fds[0]);
  for (const pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) slowest = -1;
  }
  return slowest;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  const int trials = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  ::unsetenv("EMBER_JOB_SECRET");
  ::unsetenv("EMBER_JOB_SECRET_FILE");
  std::vector<double> times[2];
  for (int t = 0; t < trials + 1; ++t) {  // the first round warms the page cache, untimed
    for (const bool secret : {false, true}) {
      const double seconds = trial(secret);
      if (seconds < 0) {
        std::fprintf(stderr, "tcp_bootstrap: a trial failed\n");
        return 1;
      }
      if (t > 0) times[secret ? 1 : 0].push_back(seconds);
    }
  }
  for (const bool secret : {false, true}) {
    const auto& v = times[secret ? 1 : 0];
    std::printf(
        "{\"bench\": \"tcp_bootstrap\", \"ranks\": %d, \"job_secret\": %s, \"trials\": %d, "
        "\"median_ms\": %.2f, \"min_ms\": %.2f, \"max_ms\": %.2f}\n",
        kRanks, secret ? "true" : "false", trials, 1e3 * median(v),
        1e3 * *std::min_element(v.begin(), v.end()), 1e3 * *std::max_element(v.begin(), v.end()));
  }
  return 0;
}

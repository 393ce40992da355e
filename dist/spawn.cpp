#include "spawn.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>

#include "detail/auth.h"
#include "detail/supervisor.h"

namespace ember::dist::detail {

namespace {

constexpr const char* kWorkerVar = "EMBER_SPAWN_WORKER";  // "<call>:<rank>" of a worker
constexpr const char* kResultVar = "EMBER_SPAWN_RESULT_FD";

struct WorkerMarker {
  int call = -1;
  int rank = -1;
  int fd = -1;
};

// Read once, when the library loads (before main), and removed from the environment, with the
// result pipe made close-on-exec, so that nothing the worker starts sees either.
const WorkerMarker& worker_marker() {
  static const WorkerMarker marker = [] {
    WorkerMarker m;
    const char* worker = std::getenv(kWorkerVar);
    const char* fd = std::getenv(kResultVar);
    if (worker != nullptr && fd != nullptr && std::sscanf(worker, "%d:%d", &m.call, &m.rank) == 2) {
      m.fd = std::atoi(fd);
      ::fcntl(m.fd, F_SETFD, FD_CLOEXEC);
    }
    ::unsetenv(kWorkerVar);
    ::unsetenv(kResultVar);
    return m;
  }();
  return marker;
}
[[maybe_unused]] const WorkerMarker& g_marker_at_load = worker_marker();

int64_t monotonic_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

// A worker's answer: "R" + fn's bytes, or "E" + when it failed + the exception's message.
std::string failure_frame(const std::string& message) {
  const int64_t when = monotonic_ns();
  return "E" + std::string(reinterpret_cast<const char*>(&when), sizeof(when)) + message;
}

[[noreturn]] void run_worker(const std::function<std::string(int)>& fn, const WorkerMarker& m) {
  std::string frame;
  int code = 0;
  try {
    frame = "R" + fn(m.rank);
  } catch (const std::exception& e) {
    frame = failure_frame(e.what());
    code = 1;
  } catch (...) {
    frame = failure_frame("an exception that is not a std::exception");
    code = 1;
  }
  write_fd(m.fd, frame.data(), frame.size());
  ::close(m.fd);
  std::exit(code);
}

}  // namespace

std::vector<std::string> spawn_bytes(int nprocs, const std::function<std::string(int)>& fn,
                                     const SpawnOptions& options) {
  static std::atomic<int> calls{0};
  const int call = calls++;
  const WorkerMarker& marker = worker_marker();
  if (marker.call == call) run_worker(fn, marker);

  EMBER_CHECK(nprocs >= 1, "spawn", "nprocs=", nprocs, " must be at least 1");
  EMBER_CHECK(options.grace.count() >= 0 && options.timeout.count() >= 0, "spawn", "grace (",
              options.grace.count(), " ms) and timeout (", options.timeout.count(),
              " ms) must not be negative");
  const int port =
      options.master_port > 0 ? options.master_port : pick_free_port(options.master_addr);
  std::unique_ptr<SecretFile> secret;
  if (read_job_secret().empty()) secret = std::make_unique<SecretFile>();

  const std::vector<std::string> command = own_command_line();
  std::vector<WorkerLaunch> launches(static_cast<size_t>(nprocs));
  for (int rank = 0; rank < nprocs; ++rank) {
    WorkerLaunch& l = launches[static_cast<size_t>(rank)];
    l.argv = command;
    l.program = "/proc/self/exe";  // this very binary, even if its path changed since
    l.env = {{"RANK", std::to_string(rank)},
             {"LOCAL_RANK", std::to_string(rank)},
             {"WORLD_SIZE", std::to_string(nprocs)},
             {"LOCAL_WORLD_SIZE", std::to_string(nprocs)},
             {"MASTER_ADDR", options.master_addr},
             {"MASTER_PORT", std::to_string(port)},
             {"OMPI_COMM_WORLD_RANK", std::nullopt},
             {"OMPI_COMM_WORLD_SIZE", std::nullopt},
             {"OMPI_COMM_WORLD_LOCAL_RANK", std::nullopt},
             {kWorkerVar, std::to_string(call) + ":" + std::to_string(rank)}};
    if (secret) l.env["EMBER_JOB_SECRET_FILE"] = secret->path();
    l.result_fd_variable = kResultVar;
  }

  Supervisor workers(options.grace);
  workers.start(launches);
  const auto start = std::chrono::steady_clock::now();
  const auto who = [nprocs](int r) {
    return "spawn: rank " + std::to_string(r) + " of " + std::to_string(nprocs);
  };
  // A failure: when it happened (CLOCK_MONOTONIC, shared by all processes) and what it was.
  // Once one worker fails the others soon fail too (a peer closed its connection); the
  // earliest is the cause.
  std::vector<std::pair<int64_t, std::string>> failures;
  int finished = 0;
  bool failed = false;
  while (!failed) {
    const auto event = workers.wait(std::chrono::milliseconds(20));
    if (event.kind == Supervisor::Event::kExited) {
      const int r = event.worker;
      const std::string& out = workers.result(r);
      const bool ok = WIFEXITED(event.wait_status) && WEXITSTATUS(event.wait_status) == 0;
      if (ok && !out.empty() && out[0] == 'R') {
        if (++finished == nprocs) break;
      } else if (out.empty() || out[0] != 'E') {
        failures.emplace_back(
            monotonic_ns(),
            ok ? who(r) +
                     " exited without returning from fn: the program did not reach the "
                     "same spawn() call when run again (see dist/spawn.h)"
               : who(r) + " (pid " + std::to_string(workers.pid(r)) + ") " +
                     describe_exit(event.wait_status));
      }
    }
    for (int r = 0; r < nprocs; ++r) failed = failed || workers.result(r).starts_with("E");
    failed = failed || !failures.empty();
    if (!failed && options.timeout.count() > 0 &&
        std::chrono::steady_clock::now() - start > options.timeout) {
      workers.stop();
      throw Error("spawn: the workers did not finish within " +
                  std::to_string(options.timeout.count()) + " ms (" +
                  std::to_string(nprocs - finished) + " of " + std::to_string(nprocs) +
                  " still running); stopped them");
    }
  }
  if (failed) {
    workers.stop();  // reaps every worker and reads their pipes to the end
    for (int r = 0; r < nprocs; ++r) {
      const std::string& out = workers.result(r);
      if (!out.starts_with("E") || out.size() < 1 + sizeof(int64_t)) continue;
      int64_t when = 0;
      std::memcpy(&when, out.data() + 1, sizeof(when));
      failures.emplace_back(when, who(r) + " failed: " + out.substr(1 + sizeof(when)));
    }
    throw Error(std::min_element(failures.begin(), failures.end())->second);
  }
  std::vector<std::string> results;
  for (int r = 0; r < nprocs; ++r) results.push_back(workers.result(r).substr(1));
  return results;
}

}  // namespace ember::dist::detail

#include "supervisor.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <netdb.h>
#include <openssl/rand.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include <ember/tensor/error.h>

#include "socket.h"

extern char** environ;

namespace ember::dist::detail {

namespace {

using Clock = std::chrono::steady_clock;

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// PATH lookup in the parent, so that a missing program is an error here, not in the worker.
std::string resolve_program(const std::string& name) {
  EMBER_CHECK(!name.empty(), "launch", "no program to run");
  if (name.find('/') != std::string::npos) {
    EMBER_CHECK(::access(name.c_str(), X_OK) == 0, "launch", "cannot run ", name, ": ",
                std::strerror(errno));
    return name;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  for (;;) {
    const size_t end = dirs.find(':', start);
    std::string dir =
        dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string candidate = dir.empty() ? std::string(".") : dir;
    candidate += '/';
    candidate += name;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  throw Error("launch: program \"" + name + "\" not found in PATH");
}

std::vector<std::string> environment_for(const WorkerLaunch& launch, int result_fd) {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry = *e;
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  for (const auto& [key, value] : launch.env) {
    if (value)
      env[key] = *value;
    else
      env.erase(key);
  }
  if (!launch.result_fd_variable.empty()) {
    env[launch.result_fd_variable] = std::to_string(result_fd);
  }
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [key, value] : env) out.push_back(key + "=" + value);
  return out;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// The launcher's caught signals, as bytes on a self-pipe that wait() polls.
int g_signal_pipe[2] = {-1, -1};
void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

std::string describe_exit(int wait_status) {
  if (WIFEXITED(wait_status))
    return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    return "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
  }
  return "ended with wait status " + std::to_string(wait_status);
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

Supervisor::Supervisor(std::chrono::milliseconds grace) : grace_(grace) {}

Supervisor::~Supervisor() {
  stop();
  for (Worker& w : workers_) {
    if (w.pipe_fd >= 0) ::close(w.pipe_fd);
    close_pid_fd(w);
  }
}

void Supervisor::close_pid_fd(Worker& w) {
  if (w.pid_fd >= 0) ::close(w.pid_fd);
  w.pid_fd = -1;
}

void Supervisor::start(const std::vector<WorkerLaunch>& launches) {
  for (const WorkerLaunch& launch : launches) {
    EMBER_CHECK(!launch.argv.empty(), "launch", "a worker has no command line");
    const std::string program =
        resolve_program(launch.program.empty() ? launch.argv.front() : launch.program);
    int fds[2] = {-1, -1};
    if (!launch.result_fd_variable.empty()) {
      EMBER_CHECK(::pipe2(fds, O_CLOEXEC) == 0, "launch", "pipe2 failed: ", std::strerror(errno));
    }
    // Everything the child needs is built before fork(): after it, only async-signal-safe calls.
    std::vector<std::string> args = launch.argv;
    std::vector<std::string> env = environment_for(launch, fds[1]);
    std::vector<char*> argv = pointers(args);
    std::vector<char*> envp = pointers(env);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the supervisor died before prctl
      sigset_t none;
      ::sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      // A launcher started in the background may ignore SIGINT (exec keeps that): its
      // workers must still end on the SIGINT it forwards.
      ::signal(SIGPIPE, SIG_DFL);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      // Descriptors this process inherited without O_CLOEXEC stay here too (as Python's
      // close_fds): only stdin, stdout, stderr and the result pipe reach the worker.
      ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
      if (fds[1] >= 0) ::fcntl(fds[1], F_SETFD, 0);  // this one pipe survives exec
      ::execve(program.c_str(), argv.data(), envp.data());
      const char* why = std::strerror(errno);
      const char prefix[] = "launch: execve failed for ";
      [[maybe_unused]] ssize_t n = ::write(2, prefix, sizeof(prefix) - 1);
      n = ::write(2, program.c_str(), program.size());
      n = ::write(2, ": ", 2);
      n = ::write(2, why, std::strlen(why));
      n = ::write(2, "\n", 1);
      ::_exit(127);
    }
    const int fork_errno = errno;
    if (fds[1] >= 0) ::close(fds[1]);
    if (pid < 0) {
      if (fds[0] >= 0) ::close(fds[0]);
      stop();
      throw Error(std::string("launch: fork failed: ") + std::strerror(fork_errno));
    }
    ::setpgid(pid, pid);  // also here, so that a signal sent at once reaches its group
    Worker w;
    w.pid = pid;
    w.pid_fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));  // close-on-exec
    w.pipe_fd = fds[0];
    if (w.pipe_fd >= 0) ::fcntl(w.pipe_fd, F_SETFL, O_NONBLOCK);
    workers_.push_back(std::move(w));
  }
}

void Supervisor::drain(Worker& w, bool to_end) {
  if (w.pipe_fd < 0) return;
  // After the worker's exit its pipe ends at once, unless something it started holds the write
  // end: then we give up after a second rather than wait for that.
  const auto deadline = Clock::now() + std::chrono::seconds(1);
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(w.pipe_fd, buffer, sizeof(buffer));
    if (n > 0) {
      w.result.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      ::close(w.pipe_fd);
      w.pipe_fd = -1;
      return;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN || !to_end || Clock::now() > deadline) {
      if (to_end) {
        ::close(w.pipe_fd);
        w.pipe_fd = -1;
      }
      return;
    }
    pollfd p{w.pipe_fd, POLLIN, 0};
    ::poll(&p, 1, 50);
  }
}

Supervisor::Event Supervisor::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    for (int i = 0; i < size(); ++i) {
      Worker& w = workers_[static_cast<size_t>(i)];
      if (w.reaped) continue;
      int status = 0;
      const pid_t got = ::waitpid(w.pid, &status, WNOHANG);
      if (got == w.pid) {
        w.reaped = true;
        w.wait_status = status;
        drain(w, true);
        close_pid_fd(w);
        return {Event::kExited, i, status, 0};
      }
    }
    std::vector<pollfd> fds;
    if (g_signal_pipe[0] >= 0) fds.push_back({g_signal_pipe[0], POLLIN, 0});
    bool all_pid_fds = true;
    for (const Worker& w : workers_) {
      if (w.pipe_fd >= 0) fds.push_back({w.pipe_fd, POLLIN, 0});
      if (!w.reaped && w.pid_fd >= 0) fds.push_back({w.pid_fd, POLLIN, 0});
      all_pid_fds = all_pid_fds && (w.reaped || w.pid_fd >= 0);
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    // A pidfd wakes poll() at its process's exit; without them, waitpid is polled every 10 ms.
    const int ms =
        static_cast<int>(std::clamp<int64_t>(left.count() + 1, 0, all_pid_fds ? 1000 : 10));
    if (::poll(fds.data(), fds.size(), ms) > 0) {
      if (g_signal_pipe[0] >= 0 && (fds[0].revents & POLLIN) != 0) {
        unsigned char sig = 0;
        if (::read(g_signal_pipe[0], &sig, 1) == 1) return {Event::kSignal, -1, 0, sig};
      }
      for (Worker& w : workers_) drain(w, false);
    }
    if (Clock::now() >= deadline) return {};
  }
}

int Supervisor::running() const {
  return static_cast<int>(
      std::count_if(workers_.begin(), workers_.end(), [](const Worker& w) { return !w.reaped; }));
}

void Supervisor::signal_all(int sig) {
  for (const Worker& w : workers_) {
    if (w.reaped) continue;
    if (::kill(-w.pid, sig) != 0) ::kill(w.pid, sig);
  }
}

void Supervisor::stop() {
  if (running() == 0) return;
  signal_all(SIGTERM);
  const auto deadline = Clock::now() + grace_;
  for (;;) {
    for (Worker& w : workers_) {
      if (!w.reaped && ::waitpid(w.pid, &w.wait_status, WNOHANG) == w.pid) w.reaped = true;
    }
    if (running() == 0) break;
    if (Clock::now() >= deadline) {
      signal_all(SIGKILL);
      for (Worker& w : workers_) {
        if (w.reaped) continue;
        while (::waitpid(w.pid, &w.wait_status, 0) < 0 && errno == EINTR) {
        }
        w.reaped = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (Worker& w : workers_) drain(w, false);
}

void Supervisor::catch_signals() {
  if (g_signal_pipe[0] >= 0) return;
  EMBER_CHECK(::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "launch",
              "pipe2 failed: ", std::strerror(errno));
  struct sigaction action {};
  action.sa_handler = on_signal;
  ::sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, nullptr);
  ::sigaction(SIGTERM, &action, nullptr);
}

int Supervisor::caught_signal() {
  unsigned char sig = 0;
  return g_signal_pipe[0] >= 0 && ::read(g_signal_pipe[0], &sig, 1) == 1 ? sig : 0;
}

int pick_free_port(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), "0", &hints, &found);
  EMBER_CHECK(rc == 0, "launch", "cannot resolve ", host, ": ", ::gai_strerror(rc));
  int port = 0;
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr && port == 0; a = a->ai_next) {
    FdGuard fd{::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol)};
    if (fd.fd < 0 || ::bind(fd.fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
      continue;
    }
    port = bound_port(fd.fd);
  }
  ::freeaddrinfo(found);
  EMBER_CHECK(port > 0, "launch", "no free TCP port on ", host, ": ", why);
  return port;
}

SecretFile::SecretFile() {
  unsigned char bytes[32];
  EMBER_CHECK(::RAND_bytes(bytes, sizeof(bytes)) == 1, "job secret",
              "OpenSSL's RAND_bytes failed to draw a secret");
  static const char* kHex = "0123456789abcdef";
  for (unsigned char b : bytes) {
    secret_ += kHex[b >> 4];
    secret_ += kHex[b & 15];
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && tmp[0] != '\0' ? tmp : "/tmp") + "/ember-job-XXXXXX";
  EMBER_CHECK(::mkdtemp(pattern.data()) != nullptr, "job secret", "cannot make a private folder ",
              pattern, ": ", std::strerror(errno));
  dir_ = pattern;  // mkdtemp makes it 0700
  path_ = dir_ + "/secret";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  const bool written = fd >= 0 && write_fd(fd, secret_.data(), secret_.size());
  const int saved = errno;
  if (fd >= 0) ::close(fd);
  if (!written) {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
    throw Error("job secret: cannot write " + path_ + ": " + std::strerror(saved));
  }
}

SecretFile::~SecretFile() {
  ::unlink(path_.c_str());
  ::rmdir(dir_.c_str());
}

bool write_fd(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t done = ::write(fd, p, n);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    p += done;
    n -= static_cast<size_t>(done);
  }
  return true;
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> out;
  size_t start = 0;
  while (start < all.size()) {
    const size_t end = all.find('\0', start);
    out.push_back(all.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace ember::dist::detail

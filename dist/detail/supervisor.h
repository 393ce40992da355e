// Process supervision shared by dist::spawn (workers of this program) and ember-run (workers
// of any program): start a set of workers with their launch variables, watch them, and when
// one ends badly stop the others (SIGTERM, then SIGKILL after a grace), reaping every one.
//
// NOTE: hygiene every worker gets, whoever starts it:
//   - fork() is followed at once by execve() (only async-signal-safe calls between), so the
//     parent's threads, MPI, OpenMP pools, CUDA contexts and OpenSSL state never reach a worker
//     half-copied;
//   - each worker leads its own process group (signals reach what it starts, too) and gets
//     PR_SET_PDEATHSIG=SIGKILL, so it dies with the thread that started it, even on SIGKILL;
//   - a worker inherits only stdin, stdout, stderr and, where asked, the write end of its own
//     result pipe (every other descriptor is marked close-on-exec in the child before exec,
//     as Python's subprocess close_fds does, and the supervisor's own are O_CLOEXEC);
//   - SIGINT, SIGTERM and SIGPIPE start at their defaults in a worker, and its signal mask
//     empty, whatever this process ignores or blocks;
//   - every wait is bounded, and the destructor stops and reaps whatever is still running.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ember::dist::detail {

// "exited with status 3", "was killed by signal 9 (SIGKILL)" for a waitpid() status.
std::string describe_exit(int wait_status);
// The status a shell reports for it: the exit code, or 128 + the signal number.
int exit_code_of(int wait_status);

struct WorkerLaunch {
  // The command line; argv[0] is the program (a path, or a name looked up in PATH) unless
  // `program` is set.
  std::vector<std::string> argv;
  std::string program;
  // Set on top of this process's environment; nullopt removes the variable.
  std::map<std::string, std::optional<std::string>> env;
  // Give the worker a pipe back to the supervisor: its write end's descriptor number is put
  // in the variable named here (for spawn's results); "" for none.
  std::string result_fd_variable;
};

class Supervisor {
 public:
  // `grace`: how long stop() waits after SIGTERM before SIGKILL.
  explicit Supervisor(std::chrono::milliseconds grace);
  // stop(): no worker outlives its supervisor.
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts one worker per launch, worker i from launches[i]. ember::Error when a program is
  // not found or a process cannot be made (the workers already started are stopped).
  void start(const std::vector<WorkerLaunch>& launches);

  struct Event {
    enum Kind { kExited, kSignal, kTimeout } kind = kTimeout;
    int worker = -1;      // kExited: which worker ended
    int wait_status = 0;  // kExited: its waitpid() status
    int signal = 0;       // kSignal: the signal this process caught (see catch_signals)
  };
  // Waits up to `timeout` for a worker to end (reading the result pipes meanwhile) or for a
  // caught signal. A worker's pipe is read to its end before its exit is reported. Exits are
  // seen at once (a pidfd per worker), so the first exit reported is the first that happened.
  Event wait(std::chrono::milliseconds timeout);

  // Sends `sig` to each running worker's process group.
  void signal_all(int sig);
  // SIGTERM to every running worker, SIGKILL to those still running after the grace; returns
  // once every worker is reaped.
  void stop();

  int size() const { return static_cast<int>(workers_.size()); }
  int running() const;
  pid_t pid(int worker) const { return workers_.at(worker).pid; }
  // What worker wrote to its result pipe.
  const std::string& result(int worker) const { return workers_.at(worker).result; }

  // From now on SIGINT and SIGTERM sent to this process are caught and reported by wait()
  // (as kSignal) instead of ending it. For a launcher; a library leaves signals alone.
  static void catch_signals();
  // A signal caught since (and not yet reported by wait()), taken; 0 when none. For a
  // launcher's waits without workers.
  static int caught_signal();

 private:
  struct Worker {
    pid_t pid = -1;
    int pid_fd = -1;   // pidfd_open(): readable at the exit; -1 where the kernel has none
    int pipe_fd = -1;  // read end, -1 when none or closed
    std::string result;
    bool reaped = false;
    int wait_status = 0;
  };
  void drain(Worker& w, bool to_end);
  static void close_pid_fd(Worker& w);
  std::chrono::milliseconds grace_;
  std::vector<Worker> workers_;
};

// A TCP port on `host` that nothing listens on now (bound to port 0, then released). Another
// process may take it before it is used; callers meet there within a timeout.
int pick_free_port(const std::string& host);

// A fresh random job secret (32 bytes from OpenSSL's RAND_bytes, hex) in a 0600 file of a
// 0700 private temporary folder; both are removed when this object goes.
class SecretFile {
 public:
  SecretFile();
  ~SecretFile();
  SecretFile(const SecretFile&) = delete;
  SecretFile& operator=(const SecretFile&) = delete;
  const std::string& path() const { return path_; }
  const std::string& secret() const { return secret_; }

 private:
  std::string dir_, path_, secret_;
};

// Writes all `n` bytes to a file or pipe (write_all in socket.h is for sockets); false on error.
bool write_fd(int fd, const void* data, size_t n);

// This program's command line, from /proc/self/cmdline.
std::vector<std::string> own_command_line();

}  // namespace ember::dist::detail

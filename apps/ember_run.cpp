// ember-run: starts the workers of a distributed program on this node, as torchrun does.
//
//   ember-run --nproc-per-node 4 ember-train --device cuda ...
//   ember-run --nnodes 2 --node-rank R --master-addr 10.0.0.1 --master-port 29500
//             --nproc-per-node 8 --max-restarts 3 ember-train ...      (on each node R)
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (the node),
// MASTER_ADDR, MASTER_PORT and EMBER_RESTART_COUNT (TORCHELASTIC_RESTART_COUNT too), so
// init_process_group() needs no arguments. When a worker fails, the others are stopped
// (SIGTERM, SIGKILL after --grace) and ember-run exits with the failing worker's status (128 +
// the signal for a killed one), naming its rank; with --max-restarts K the workers of every
// node are started again instead, up to K times (a new rendezvous round, the same world size):
// the program resumes from its own snapshot. SIGINT and SIGTERM are forwarded to the workers.
//
// Flight records: the workers write their flight-recorder dumps (see
// <ember/dist/flight_recorder.h>) to EMBER_FLIGHT_DIR, which ember-run sets to the absolute
// path of its own (default ./ember-flight), clearing the rank<R>.json dumps left there by an
// earlier round or job. When a worker fails, the others get SIGUSR1 first, and a second to
// write theirs, before they are stopped; ember-run then prints the analysis of the dumps
// (analyze_flight_dumps: who waits where, who never arrived).
//
// Threads: unless OMP_NUM_THREADS is set, each worker gets it as its share of the CPUs
// ember-run may use (cpu_share: their count over --nproc-per-node, at least 1; torchrun sets
// 1), which ember's thread count and OpenMP's follow.
//
// Several nodes: node 0's ember-run serves the launchers' store on --master-addr:--master-port
// and every node's ember-run meets there; a failure on any node stops the workers of all nodes
// (and restarts them all). Each round's workers meet at a fresh port that node 0 picks.
//
// The job secret: unless EMBER_JOB_SECRET or EMBER_JOB_SECRET_FILE is set (then it is used as
// is, by the workers and the launchers' store), a single-node ember-run draws a fresh random
// secret per job and hands it to the workers in a private 0600 file (EMBER_JOB_SECRET_FILE),
// removed at exit. Several nodes need the same secret on every node: give it (a file copied to
// every node), or pass --no-secret to run without one.
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <ember/dist/detail/auth.h>
#include <ember/dist/detail/rendezvous.h>
#include <ember/dist/detail/supervisor.h>
#include <ember/dist/flight_recorder.h>
#include <ember/tensor/error.h>
#include <ember/tensor/parallel.h>
#include <ember/tensor/version.h>
#include <CLI/CLI.hpp>

namespace {

using namespace ember::dist::detail;
using Clock = std::chrono::steady_clock;

struct RunOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: single node, a free port per round; several nodes: 29500
  int max_restarts = 0;
  double grace_s = 5;
  double rdzv_timeout_s = 300;
  bool no_secret = false;
  std::vector<std::string> command;
  int worker_threads = 0;  // OMP_NUM_THREADS for the workers; 0: the user's, left alone
};

void say(const std::string& line) { std::fprintf(stderr, "ember-run: %s\n", line.c_str()); }

struct Outcome {
  enum Kind { kDone, kFailed, kStopped } kind = kDone;
  int code = 0;
  std::string what;
};

class Launcher {
 public:
  Launcher(RunOptions options, std::optional<std::string> secret_file,
           std::unique_ptr<LauncherRendezvous> rendezvous)
      : o_(std::move(options)),
        secret_file_(std::move(secret_file)),
        rendezvous_(std::move(rendezvous)) {}

  int run() {
    for (int round = 0;; ++round) {
      const int port = rendezvous_          ? rendezvous_->begin_round(round)
                       : o_.master_port > 0 ? o_.master_port
                                            : pick_free_port(o_.master_addr);
      Outcome outcome;
      try {
        outcome = run_round(round, port);
      } catch (const std::exception& e) {
        abandon(round, e.what());
        throw;
      }
      if (outcome.kind == Outcome::kDone) return 0;
      if (outcome.kind == Outcome::kStopped) return outcome.code;
      if (round < o_.max_restarts) {
        say("restarting the workers (restart " + std::to_string(round + 1) + " of " +
            std::to_string(o_.max_restarts) + ") after: " + outcome.what);
        continue;
      }
      say("the job failed: " + outcome.what + (o_.max_restarts > 0 ? " (no restarts left)" : ""));
      return outcome.code;
    }
  }

 private:
  int world_size() const { return o_.nnodes * o_.nproc_per_node; }

  std::vector<WorkerLaunch> launches(int round, int port) const {
    std::vector<WorkerLaunch> out(static_cast<size_t>(o_.nproc_per_node));
    for (int local = 0; local < o_.nproc_per_node; ++local) {
      WorkerLaunch& l = out[static_cast<size_t>(local)];
      l.argv = o_.command;
      l.env = {{"RANK", std::to_string(o_.node_rank * o_.nproc_per_node + local)},
               {"LOCAL_RANK", std::to_string(local)},
               {"WORLD_SIZE", std::to_string(world_size())},
               {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node)},
               {"GROUP_RANK", std::to_string(o_.node_rank)},
               {"GROUP_WORLD_SIZE", std::to_string(o_.nnodes)},
               {"MASTER_ADDR", o_.master_addr},
               {"MASTER_PORT", std::to_string(port)},
               {"EMBER_RESTART_COUNT", std::to_string(round)},
               {"EMBER_MAX_RESTARTS", std::to_string(o_.max_restarts)},
               {"TORCHELASTIC_RESTART_COUNT", std::to_string(round)},
               {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o_.max_restarts)},
               // the workers must see this launcher only, not an mpirun around it
               {"OMPI_COMM_WORLD_RANK", std::nullopt},
               {"OMPI_COMM_WORLD_SIZE", std::nullopt},
               {"OMPI_COMM_WORLD_LOCAL_RANK", std::nullopt}};
      if (secret_file_) l.env["EMBER_JOB_SECRET_FILE"] = *secret_file_;
      l.env["EMBER_FLIGHT_DIR"] = flight_dir_.string();
      if (o_.worker_threads > 0) l.env["OMP_NUM_THREADS"] = std::to_string(o_.worker_threads);
    }
    return out;
  }

  static int64_t wall_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }

  // Several nodes, after this node's workers are stopped: the job's failure is the earliest
  // any launcher saw (a dead worker soon fails its peers on every node).
  Outcome settle(int round, Outcome outcome) {
    if (!rendezvous_) return outcome;
    outcome.what = rendezvous_->settle_failure(round);
    if (rendezvous_->stopped()) outcome.kind = Outcome::kStopped;
    return outcome;
  }

  // A failure recorded by another node's launcher; checked every 100 ms.
  bool remote_failure(int round, Clock::time_point& last_check) {
    if (!rendezvous_ || Clock::now() - last_check < std::chrono::milliseconds(100)) return false;
    last_check = Clock::now();
    return rendezvous_->failed(round);
  }

  // The flight-recorder dumps in flight_dir_ (rank<R>.json).
  std::vector<std::filesystem::path> flight_dumps() const {
    static const std::regex name("rank[0-9]{1,7}\\.json");
    std::vector<std::filesystem::path> found;
    std::error_code ec;
    for (const auto& item : std::filesystem::directory_iterator(flight_dir_, ec)) {
      if (std::regex_match(item.path().filename().string(), name)) found.push_back(item.path());
    }
    return found;
  }

  // A worker failed: the others write their flight records (SIGUSR1, a second at most), are
  // stopped, and the dumps' analysis is printed.
  void stop_after_failure(Supervisor& workers) {
    if (ember::dist::flight_recorder_enabled()) {
      const auto asked = std::filesystem::file_time_type::clock::now();
      workers.signal_all(SIGUSR1);
      // Until every worker still running wrote a dump since (a second at most).
      auto fresh = [&] {
        size_t count = 0;
        for (const auto& dump : flight_dumps()) {
          std::error_code ec;
          if (std::filesystem::last_write_time(dump, ec) >= asked && !ec) ++count;
        }
        return count;
      };
      const auto deadline = Clock::now() + std::chrono::seconds(1);
      while (workers.running() > 0 && Clock::now() < deadline &&
             fresh() < static_cast<size_t>(workers.running())) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    workers.stop();
    if (flight_dumps().empty()) return;
    try {
      say("flight records of the failed job (" + flight_dir_.string() + "):\n" +
          ember::dist::analyze_flight_dumps(flight_dir_.string()));
    } catch (const std::exception& e) {
      say(std::string("could not read the flight records: ") + e.what());
    }
  }

  Outcome run_round(int round, int port) {
    const int first = o_.node_rank * o_.nproc_per_node;
    for (const auto& stale : flight_dumps()) {  // an earlier round's or job's
      std::error_code ec;
      std::filesystem::remove(stale, ec);
    }
    Supervisor workers(std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000)));
    workers.start(launches(round, port));
    say("node " + std::to_string(o_.node_rank) + ", round " + std::to_string(round) +
        ": started ranks " + std::to_string(first) + ".." +
        std::to_string(first + o_.nproc_per_node - 1) + " of " + std::to_string(world_size()) +
        " (MASTER_ADDR=" + o_.master_addr + " MASTER_PORT=" + std::to_string(port) + ")");
    auto last_check = Clock::now();
    for (int finished = 0; finished < o_.nproc_per_node;) {
      const auto event = workers.wait(std::chrono::milliseconds(50));
      if (event.kind == Supervisor::Event::kSignal) return forward(workers, round, event.signal);
      if (event.kind == Supervisor::Event::kExited) {
        if (event.wait_status == 0) {
          ++finished;
          continue;
        }
        const int64_t seen = wall_ns();
        const std::string what =
            "rank " + std::to_string(first + event.worker) + " (local rank " +
            std::to_string(event.worker) + " on node " + std::to_string(o_.node_rank) + ", pid " +
            std::to_string(workers.pid(event.worker)) + ") " + describe_exit(event.wait_status);
        say(what + "; stopping the other workers");
        stop_after_failure(workers);
        if (rendezvous_) rendezvous_->report_failure(round, seen, what);
        return settle(round, {Outcome::kFailed, exit_code_of(event.wait_status), what});
      }
      if (remote_failure(round, last_check)) {
        workers.stop();
        const Outcome outcome = settle(round, {Outcome::kFailed, 1, ""});
        say("stopped the workers of node " + std::to_string(o_.node_rank) + ": " + outcome.what);
        return outcome;
      }
    }
    if (!rendezvous_) return {};
    // This node's workers are done; the job is once every node's are. A later failure
    // elsewhere restarts this node's workers too (they resume from their snapshot).
    if (rendezvous_->report_done(round) == o_.nnodes) return {};
    for (;;) {
      const auto event = workers.wait(std::chrono::milliseconds(100));
      if (event.kind == Supervisor::Event::kSignal) return forward(workers, round, event.signal);
      if (rendezvous_->done(round) == o_.nnodes) return {};
      auto unused = Clock::time_point{};
      if (remote_failure(round, unused)) return settle(round, {Outcome::kFailed, 1, ""});
    }
  }

  // This launcher cannot go on (its program cannot be started, say): the other nodes stop too
  // rather than wait for its ranks until their own timeouts.
  void abandon(int round, const std::string& why) {
    if (!rendezvous_) return;
    try {
      rendezvous_->report_failure(
          round, wall_ns(),
          "the launcher of node " + std::to_string(o_.node_rank) + " failed: " + why, true);
      rendezvous_->settle_failure(round);
    } catch (const std::exception&) {  // the store may be what failed
    }
  }

  // SIGINT / SIGTERM to ember-run: the workers get it, then the grace, then SIGKILL.
  Outcome forward(Supervisor& workers, int round, int sig) {
    const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    say("got " + name + "; forwarding it to the workers");
    workers.signal_all(sig);
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000));
    while (workers.running() > 0 && Clock::now() < deadline) {
      workers.wait(std::chrono::milliseconds(20));
    }
    workers.stop();
    const std::string what =
        "the launcher of node " + std::to_string(o_.node_rank) + " was stopped by " + name;
    if (rendezvous_) {
      try {
        rendezvous_->report_failure(round, wall_ns(), what, true);
        rendezvous_->settle_failure(round);
      } catch (const std::exception&) {  // the store may be gone: stopping goes on
      }
    }
    return {Outcome::kStopped, 128 + sig, what};
  }

  RunOptions o_;
  std::optional<std::string> secret_file_;
  std::unique_ptr<LauncherRendezvous> rendezvous_;
  const std::filesystem::path flight_dir_ =
      std::filesystem::absolute(ember::dist::flight_recorder_dir());
};

int parse(int argc, char** argv, RunOptions& o) {
  CLI::App app{
      "ember-run: starts the workers of a distributed program on this node, like torchrun.\n"
      "Unless OMP_NUM_THREADS is set, each worker gets OMP_NUM_THREADS = its share of the "
      "CPUs (their count over --nproc-per-node, at least 1).\n"
      "Usage: ember-run [options] PROGRAM [ARGS...]"};
  app.set_version_flag("--version", "ember-run " + std::string(ember::version()));
  app.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                 "Workers on this node (one per GPU)")
      ->check(CLI::PositiveNumber);
  app.add_option("--nnodes", o.nnodes, "Nodes in the job (one ember-run each)")
      ->check(CLI::PositiveNumber);
  app.add_option("--node-rank,--node_rank", o.node_rank, "This node's index, 0 to nnodes-1")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--master-addr,--master_addr", o.master_addr,
                 "Address of node 0, where the launchers and the workers meet");
  app.add_option("--master-port,--master_port", o.master_port,
                 "Port of node 0's launcher store (several nodes; default 29500). One node: "
                 "the workers' MASTER_PORT (default: a free port per round)")
      ->check(CLI::Range(1, 65535));
  app.add_option("--max-restarts,--max_restarts", o.max_restarts,
                 "Restart all workers up to this many times after a failure")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grace", o.grace_s,
                 "Seconds stopped workers get between SIGTERM and SIGKILL (default 5)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--rdzv-timeout", o.rdzv_timeout_s,
                 "Seconds the launchers of several nodes wait for each other (default 300)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-secret", o.no_secret,
               "Without EMBER_JOB_SECRET(_FILE): run without a job secret (several nodes "
               "refuse to otherwise; one node draws a fresh one otherwise)");
  // ember-run's own options end at the first argument that is neither an option nor an
  // option's value (or at "--"): that one is the program, and everything after is its own.
  int own = 1;
  while (own < argc) {
    const std::string arg = argv[own];
    if (arg == "--") break;
    if (arg.empty() || arg[0] != '-') break;
    const bool takes_value = arg.find('=') == std::string::npos && arg != "--no-secret" &&
                             arg != "-h" && arg != "--help" && arg != "--version";
    own += takes_value ? 2 : 1;
  }
  own = std::min(own, argc);
  try {
    app.parse(own, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (own < argc && std::string(argv[own]) == "--") ++own;
  for (int i = own; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.command.empty()) {
    std::fprintf(stderr, "ember-run: no program to run\n%s", app.help().c_str());
    return 2;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  RunOptions o;
  if (const int code = parse(argc, argv, o); code >= 0) return code;
  try {
    EMBER_CHECK(o.node_rank < o.nnodes, "ember-run", "--node-rank ", o.node_rank, " is not in [0, ",
                o.nnodes, ") (--nnodes ", o.nnodes, ")");
    Supervisor::catch_signals();
    // torchrun's "Setting OMP_NUM_THREADS environment variable for each process", with the
    // share of the CPUs rather than 1.
    const char* user_threads = std::getenv("OMP_NUM_THREADS");
    if (user_threads == nullptr || user_threads[0] == '\0') {
      o.worker_threads = ember::cpu_share(o.nproc_per_node);
      say("setting OMP_NUM_THREADS=" + std::to_string(o.worker_threads) +
          " for each worker: its share of the " + std::to_string(ember::available_cpus()) +
          " CPUs this launcher may use over " + std::to_string(o.nproc_per_node) +
          " worker(s); set OMP_NUM_THREADS to choose another count");
    }
    const std::string given = read_job_secret();
    std::unique_ptr<SecretFile> fresh;
    if (given.empty() && !o.no_secret) {
      EMBER_CHECK(o.nnodes == 1, "ember-run", "--nnodes ", o.nnodes,
                  " needs the same job secret on every node: "
                  "set EMBER_JOB_SECRET_FILE to a file (mode 0600) with the same contents on "
                  "every node, or EMBER_JOB_SECRET, before starting ember-run; or pass "
                  "--no-secret to run without one (anybody who reaches the ports can join)");
      fresh = std::make_unique<SecretFile>();
    }
    std::unique_ptr<LauncherRendezvous> rendezvous;
    if (o.nnodes > 1) {
      rendezvous = std::make_unique<LauncherRendezvous>(
          o.master_addr, o.master_port > 0 ? o.master_port : 29500, o.nnodes, o.node_rank,
          o.nproc_per_node,
          std::chrono::milliseconds(static_cast<int64_t>(o.rdzv_timeout_s * 1000)), given);
    }
    Launcher launcher(o, fresh ? std::optional<std::string>(fresh->path()) : std::nullopt,
                      std::move(rendezvous));
    return launcher.run();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    say(what.starts_with("ember-run: ") ? what.substr(11) : what);
    return 1;
  }
}

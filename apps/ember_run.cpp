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
// Elastic mode, as torchrun's: --nnodes MIN:MAX. The same command on every node, without
// --node-rank; the job runs while at least MIN nodes are present. The launcher that can serve
// the store on --master-addr:--master-port (the first started on that host) is the master and
// node 0 of every round; the others join it. Round by round (see LauncherRendezvous), the
// launchers present get contiguous node ranks, WORLD_SIZE follows, and the workers resume from
// their snapshot. Each launcher heartbeats through the store: one silent for
// --heartbeat-timeout is dropped and the others restart without it; a launcher that arrives
// while there is room is admitted at a new round; both count against --max-restarts. SIGINT or
// SIGTERM to a launcher other than the master takes its node out of the job (the others go on);
// to the master it stops the job. The master's node is a single point of failure (it holds the
// store): if it is lost, the others give up within the heartbeat timeout.
//
// The job secret: unless EMBER_JOB_SECRET or EMBER_JOB_SECRET_FILE is set (then it is used as
// is, by the workers and the launchers' store), a single-node ember-run draws a fresh random
// secret per job and hands it to the workers in a private 0600 file (EMBER_JOB_SECRET_FILE),
// removed at exit. Several nodes need the same secret on every node: give it (a file copied to
// every node), or pass --no-secret to run without one.
#include <signal.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <regex>
#include <stdexcept>
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
  std::string nnodes_text = "1";  // N, or MIN:MAX for elastic mode
  int nnodes = 1;                 // N, or MAX
  int min_nodes = 1;
  bool elastic = false;
  int node_rank = 0;
  bool node_rank_given = false;
  bool elastic_only_given = false;  // --heartbeat-timeout or --rdzv-last-call
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: single node, a free port per round; several nodes: 29500
  int max_restarts = 0;
  double grace_s = 5;
  double rdzv_timeout_s = 300;
  double heartbeat_timeout_s = 5;
  double last_call_s = 5;
  bool no_secret = false;
  std::vector<std::string> command;
  int worker_threads = 0;  // OMP_NUM_THREADS for the workers; 0: the user's, left alone
};

void say(const std::string& line) { std::fprintf(stderr, "ember-run: %s\n", line.c_str()); }

std::string signal_label(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

// SIGINT or SIGTERM, caught while this launcher waited in a rendezvous.
struct Interrupted : std::runtime_error {
  explicit Interrupted(int sig) : std::runtime_error("ember-run: interrupted"), signal(sig) {}
  int signal;
};

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
        rendezvous_(std::move(rendezvous)) {
    if (!o_.elastic) plan_ = {0, o_.node_rank, o_.nnodes};  // the same every round
    if (rendezvous_) {
      rendezvous_->set_interrupt([] {
        if (const int sig = Supervisor::caught_signal(); sig != 0) throw Interrupted(sig);
      });
    }
  }

  int run() {
    const int first = rendezvous_ ? rendezvous_->first_round() : 0;
    if (first > 0) {  // an elastic job that runs already
      const int running = rendezvous_->nodes_in(first - 1);
      say("the job runs (round " + std::to_string(first - 1) + ": " + std::to_string(running) +
          " of at most " + std::to_string(o_.nnodes) + " nodes): " +
          (running < o_.nnodes ? "asking to join at the next round"
                               : "waiting as a spare for a place"));
    }
    for (int round = first;; ++round) {
      if (!rendezvous_) {
        plan_.port = o_.master_port > 0 ? o_.master_port : pick_free_port(o_.master_addr);
      } else {
        try {
          plan_ = rendezvous_->begin_round(round);
        } catch (const Interrupted& i) {
          return interrupted(round, i.signal);
        } catch (const std::exception&) {
          finish(false);
          throw;
        }
        if (plan_.job_over) {
          say(std::string("the job ") + (plan_.job_succeeded ? "finished" : "failed") +
              " before this launcher got a place in it");
          return plan_.job_succeeded ? 0 : 1;
        }
        if (plan_.node_rank < 0) {
          say("round " + std::to_string(round) + " is full (" + std::to_string(plan_.nnodes) +
              " nodes, --nnodes " + o_.nnodes_text + "): waiting for a place in a later one");
          continue;
        }
      }
      Outcome outcome;
      try {
        outcome = run_round(round, plan_.port);
      } catch (const Interrupted& i) {
        return interrupted(round, i.signal);
      } catch (const std::exception& e) {
        abandon(round, e.what());
        finish(false);
        throw;
      }
      if (outcome.kind != Outcome::kFailed) {
        finish(outcome.kind == Outcome::kDone);
        return outcome.kind == Outcome::kDone ? 0 : outcome.code;
      }
      if (round < o_.max_restarts) {
        say("restarting the workers (restart " + std::to_string(round + 1) + " of " +
            std::to_string(o_.max_restarts) + ") after: " + outcome.what);
        continue;
      }
      say("the job failed: " + outcome.what + (o_.max_restarts > 0 ? " (no restarts left)" : ""));
      finish(false);
      return outcome.code;
    }
  }

 private:
  int world_size() const { return plan_.nnodes * o_.nproc_per_node; }

  // The job ended on this launcher: the elastic master tells the launchers still waiting.
  void finish(bool succeeded) {
    if (!rendezvous_ || !rendezvous_->can_report()) return;
    try {
      rendezvous_->finish(succeeded);
    } catch (const std::exception&) {  // the store may be what failed
    }
  }

  // "node 1", this launcher's node in the current round.
  std::string node() const {
    return plan_.node_rank >= 0 ? "node " + std::to_string(plan_.node_rank)
                                : "a node not yet in a round";
  }

  std::vector<WorkerLaunch> launches(int round, int port) const {
    std::vector<WorkerLaunch> out(static_cast<size_t>(o_.nproc_per_node));
    for (int local = 0; local < o_.nproc_per_node; ++local) {
      WorkerLaunch& l = out[static_cast<size_t>(local)];
      l.argv = o_.command;
      l.env = {{"RANK", std::to_string(plan_.node_rank * o_.nproc_per_node + local)},
               {"LOCAL_RANK", std::to_string(local)},
               {"WORLD_SIZE", std::to_string(world_size())},
               {"LOCAL_WORLD_SIZE", std::to_string(o_.nproc_per_node)},
               {"GROUP_RANK", std::to_string(plan_.node_rank)},
               {"GROUP_WORLD_SIZE", std::to_string(plan_.nnodes)},
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
    return rendezvous_->poll(round);
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
    const int first = plan_.node_rank * o_.nproc_per_node;
    for (const auto& stale : flight_dumps()) {  // an earlier round's or job's
      std::error_code ec;
      std::filesystem::remove(stale, ec);
    }
    Supervisor workers(std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000)));
    workers.start(launches(round, port));
    say("node " + std::to_string(plan_.node_rank) + ", round " + std::to_string(round) +
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
        const int64_t seen = wall_clock_ns();
        const std::string what = "rank " + std::to_string(first + event.worker) + " (local rank " +
                                 std::to_string(event.worker) + " on node " +
                                 std::to_string(plan_.node_rank) + ", pid " +
                                 std::to_string(workers.pid(event.worker)) + ") " +
                                 describe_exit(event.wait_status);
        say(what + "; stopping the other workers");
        stop_after_failure(workers);
        if (rendezvous_) rendezvous_->report_failure(round, seen, what);
        return settle(round, {Outcome::kFailed, exit_code_of(event.wait_status), what});
      }
      if (remote_failure(round, last_check)) {
        workers.stop();
        const Outcome outcome = settle(round, {Outcome::kFailed, 1, ""});
        say("stopped the workers of node " + std::to_string(plan_.node_rank) + ": " + outcome.what);
        return outcome;
      }
    }
    if (!rendezvous_) return {};
    // This node's workers are done; the job is once every node's are. A later failure
    // elsewhere restarts this node's workers too (they resume from their snapshot).
    if (rendezvous_->report_done(round) == plan_.nnodes) return {};
    for (;;) {
      const auto event = workers.wait(std::chrono::milliseconds(100));
      if (event.kind == Supervisor::Event::kSignal) return forward(workers, round, event.signal);
      if (rendezvous_->done(round) == plan_.nnodes) return {};
      auto unused = Clock::time_point{};
      if (remote_failure(round, unused)) return settle(round, {Outcome::kFailed, 1, ""});
    }
  }

  // This launcher cannot go on (its program cannot be started, say): the other nodes stop too
  // rather than wait for its ranks until their own timeouts; in elastic mode a launcher other
  // than the master leaves instead, and the others go on without it.
  void abandon(int round, const std::string& why) {
    if (!rendezvous_ || !rendezvous_->can_report()) return;
    const std::string what = "the launcher of " + node() + " failed: " + why;
    try {
      if (rendezvous_->elastic() && !rendezvous_->master()) {
        rendezvous_->leave(round, wall_clock_ns(), what);
        return;
      }
      rendezvous_->report_failure(round, wall_clock_ns(), what, true);
      rendezvous_->settle_failure(round);
    } catch (const std::exception&) {  // the store may be what failed
    }
  }

  // SIGINT / SIGTERM to ember-run: the workers get it, then the grace, then SIGKILL.
  Outcome forward(Supervisor& workers, int round, int sig) {
    const int64_t seen = wall_clock_ns();  // before the workers' failures it causes
    say("got " + signal_label(sig) + "; forwarding it to the workers");
    workers.signal_all(sig);
    const auto deadline =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o_.grace_s * 1000));
    while (workers.running() > 0 && Clock::now() < deadline) {
      workers.wait(std::chrono::milliseconds(20));
    }
    workers.stop();
    return stopped_by(round, sig, seen);
  }

  // This launcher was stopped by `sig`: in elastic mode a launcher other than the master leaves
  // the job (the others go on without it); otherwise the job stops on every node.
  Outcome stopped_by(int round, int sig, int64_t seen) {
    const std::string what = "the launcher of " + node() + " was stopped by " + signal_label(sig);
    if (rendezvous_ && rendezvous_->can_report()) {
      try {
        if (rendezvous_->elastic() && !rendezvous_->master()) {
          rendezvous_->leave(round, seen, what + ", which takes its node out of the job");
        } else {
          rendezvous_->report_failure(round, seen, what, true);
          rendezvous_->settle_failure(round);
        }
      } catch (const std::exception&) {  // the store may be gone: stopping goes on
      }
    }
    return {Outcome::kStopped, 128 + sig, what};
  }

  // SIGINT or SIGTERM while no workers run (a rendezvous wait).
  int interrupted(int round, int sig) {
    say("got " + signal_label(sig) + " while waiting for round " + std::to_string(round) +
        "; stopping");
    const Outcome outcome = stopped_by(round, sig, wall_clock_ns());
    finish(false);
    return outcome.code;
  }

  RunOptions o_;
  std::optional<std::string> secret_file_;
  std::unique_ptr<LauncherRendezvous> rendezvous_;
  RoundPlan plan_;  // this node's part in the current round
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
  app.add_option("--nnodes", o.nnodes_text,
                 "Nodes in the job (one ember-run each): N, or MIN:MAX for elastic mode (the "
                 "job runs while at least MIN are present; nodes may leave and join)");
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
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "Elastic mode: seconds without a heartbeat after which a node is dropped and a "
                 "new round starts (default 5)")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--rdzv-last-call", o.last_call_s,
                 "Elastic mode: seconds a round with MIN nodes waits for more (default 5)")
      ->check(CLI::Range(0.0, 86400.0));
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
  o.node_rank_given = app.count("--node-rank") > 0;
  o.elastic_only_given = app.count("--heartbeat-timeout") > 0 || app.count("--rdzv-last-call") > 0;
  for (int i = own; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.command.empty()) {
    std::fprintf(stderr, "ember-run: no program to run\n%s", app.help().c_str());
    return 2;
  }
  return -1;
}

// --nnodes N, or MIN:MAX (elastic).
void parse_nnodes(RunOptions& o) {
  const std::string& text = o.nnodes_text;
  auto number = [&](const std::string& part) {
    int value = 0;
    const auto [end, error] = std::from_chars(part.data(), part.data() + part.size(), value);
    EMBER_CHECK(error == std::errc() && end == part.data() + part.size() && value >= 1, "ember-run",
                "--nnodes ", text, " is not N or MIN:MAX with 1 <= MIN <= MAX");
    return value;
  };
  const size_t colon = text.find(':');
  o.elastic = colon != std::string::npos;
  o.nnodes = number(o.elastic ? text.substr(colon + 1) : text);
  o.min_nodes = o.elastic ? number(text.substr(0, colon)) : o.nnodes;
  EMBER_CHECK(o.min_nodes <= o.nnodes, "ember-run", "--nnodes ", text,
              " is not N or MIN:MAX with 1 <= MIN <= MAX");
  EMBER_CHECK(o.elastic || !o.elastic_only_given, "ember-run",
              "--heartbeat-timeout and --rdzv-last-call are for elastic mode (--nnodes MIN:MAX; "
              "--nnodes ",
              text, ":", text, " keeps the size fixed), not --nnodes ", text);
  EMBER_CHECK(!o.elastic || !o.node_rank_given, "ember-run", "--node-rank ", o.node_rank,
              " with --nnodes ", text,
              ": in elastic mode each round numbers its nodes (the master launcher, which "
              "serves the store, is node 0); leave --node-rank out");
}

}  // namespace

int main(int argc, char** argv) {
  RunOptions o;
  if (const int code = parse(argc, argv, o); code >= 0) return code;
  try {
    parse_nnodes(o);
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
      EMBER_CHECK(o.nnodes == 1, "ember-run", "--nnodes ", o.nnodes_text,
                  " needs the same job secret on every node: "
                  "set EMBER_JOB_SECRET_FILE to a file (mode 0600) with the same contents on "
                  "every node, or EMBER_JOB_SECRET, before starting ember-run; or pass "
                  "--no-secret to run without one (anybody who reaches the ports can join)");
      fresh = std::make_unique<SecretFile>();
    }
    const std::string secret = fresh ? fresh->secret() : given;
    const auto rdzv_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(o.rdzv_timeout_s * 1000));
    const int store_port = o.master_port > 0 ? o.master_port : 29500;
    std::unique_ptr<LauncherRendezvous> rendezvous;
    if (o.elastic) {
      ElasticOptions e;
      e.min_nodes = o.min_nodes;
      e.max_nodes = o.nnodes;
      e.max_restarts = o.max_restarts;
      e.heartbeat_timeout =
          std::chrono::milliseconds(static_cast<int64_t>(o.heartbeat_timeout_s * 1000));
      e.last_call = std::chrono::milliseconds(static_cast<int64_t>(o.last_call_s * 1000));
      rendezvous = std::make_unique<LauncherRendezvous>(o.master_addr, store_port, e,
                                                        o.nproc_per_node, rdzv_timeout, secret);
      say(rendezvous->master()
              ? "elastic (--nnodes " + o.nnodes_text + "): serving the launchers' store on " +
                    o.master_addr + ":" + std::to_string(store_port) + " as the master launcher"
              : "elastic (--nnodes " + o.nnodes_text + "): joined the launchers' store at " +
                    o.master_addr + ":" + std::to_string(store_port));
    } else if (o.nnodes > 1) {
      rendezvous = std::make_unique<LauncherRendezvous>(
          o.master_addr, store_port, o.nnodes, o.node_rank, o.nproc_per_node, rdzv_timeout, secret);
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

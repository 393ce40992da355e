// init_process_group's init_method, in one place for every backend that bootstraps through the
// TCP store (TCP, NCCL): the URL parse, who this process is (explicit rank / world size or the
// launcher's), and the rendezvous that finds the store and checks that the ranks agree. Also
// the rendezvous of ember-run's launchers (LauncherRendezvous), which keeps theirs apart.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <ember/dist/init.h>
#include <ember/dist/tcp_store.h>
#include <ember/tensor/error.h>

namespace ember::dist::detail {

struct InitMethod {
  std::string url;     // as given ("" reads as "env://")
  std::string scheme;  // "env", "tcp" or "file"
  std::string host;    // tcp://
  int port = 0;        // tcp://
  std::string path;    // file://
};
// ember::Error naming the URL for an unknown scheme, a tcp:// without host or port, or a
// file:// without a path.
InitMethod parse_init_method(const std::string& url);

// The launcher's view overridden by InitOptions' explicit rank / world_size (-1: unset).
// Under mpirun explicit values must equal mpirun's. env:// takes them from the launcher when
// unset; tcp:// and file:// need both (no launcher: the local rank is LOCAL_RANK or the rank).
// launcher becomes "init_method" when the URL, not a launcher, describes the job.
LaunchEnv resolve_identity(const InitMethod& method, int rank, int world_size,
                           const LaunchEnv& launch);

struct StoreAddress {
  std::string host;
  int port = 0;
};
// Finds the job's TcpStore (env://: MASTER_ADDR:MASTER_PORT; tcp://: the URL's; file://: the
// address rank 0 published in the file) and meets every rank there within `timeout`: they must
// agree on the world size and each rank must come once. The store is detail::shared_store's, so
// the backend that follows finds it at the address returned.
// `backend` names the backend in messages.
StoreAddress rendezvous(const InitMethod& method, const LaunchEnv& self, const std::string& backend,
                        std::chrono::milliseconds timeout);

// ember-run --nnodes MIN:MAX: elastic mode, as torchrun's c10d rendezvous.
struct ElasticOptions {
  int min_nodes = 1;
  int max_nodes = 1;
  // Rounds after the first the job may start; every launcher must give the same.
  int max_restarts = 0;
  // A launcher whose heartbeat has not moved for this long is dropped (it beats every fifth
  // of it); a launcher whose store requests get no reply within it gives up.
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(5);
  // How long a round that has min_nodes waits for more before it closes.
  std::chrono::milliseconds last_call = std::chrono::seconds(5);
};

// The system clock in ns since the epoch: the time stamp of a recorded failure.
int64_t wall_clock_ns();

// This launcher's part in a round.
struct RoundPlan {
  int port = 0;           // where the round's workers meet (their MASTER_PORT, on node 0's host)
  int node_rank = -1;     // this node's rank in the round; -1: not in it (the round was full)
  int nnodes = 0;         // launchers in the round
  bool job_over = false;  // elastic: the job ended before this launcher got a place
  bool job_succeeded = false;
};

// ember-run's launchers, one per node, meet at the TcpStore that node 0's launcher serves on
// --master-addr:--master-port, in numbered rounds (one per start of the workers: the first, and
// one per restart):
//   - a round begins once every launcher has arrived at it, i.e. has stopped the workers of
//     the round before; node 0 then picks a free port of its host for the round's workers, so
//     the workers' own store (served by their rank 0) never meets the launchers' store, nor a
//     store of an earlier round with its stale keys;
//   - a launcher whose worker fails records it under the round with the time it saw it, and
//     every launcher watches for such a record to stop its own workers; once all have, each
//     names the earliest failure as the job's;
//   - a launcher whose workers all succeeded counts itself done; the job ends when all are.
// Keys live under "ember-run/". With a job secret the launchers authenticate as any client of
// the store does (detail/auth.h).
//
// Elastic mode (--nnodes MIN:MAX) changes who is in a round:
//   - the launcher that can listen on --master-addr:--master-port (the first one started on
//     that host) serves the store and is the master: node 0 of every round; every other
//     launcher takes a join number when it connects, and heartbeats (a counter it bumps every
//     fifth of the heartbeat timeout, on a connection of its own);
//   - round r closes, with the launchers that asked for it in join order (node ranks 0, 1, ...
//     contiguous), as soon as max_nodes asked; or once min_nodes asked, the last call has
//     passed since, and every live member of round r-1 has asked too (it may still be stopping
//     its workers); or, with min_nodes there, at the rendezvous timeout;
//   - while a round runs the master watches: a launcher whose heartbeat has not moved for the
//     heartbeat timeout is dropped for good (lost), and a launcher that asks to join while the
//     round has room ends it to be admitted (refused, and told so, when no restarts are left).
//     A lost member or a newcomer is recorded as the round's failure, so every launcher stops
//     its workers and the next round begins: a restart like any other;
//   - a launcher stopped by SIGINT or SIGTERM, or that cannot start its workers, leaves: it
//     records that as the round's failure and marks itself lost;
//   - a launcher that finds the round full waits for a later one as a spare;
//   - the store lives in the master launcher: if its node is lost the job cannot go on, and
//     each other launcher gives up when its requests get no reply within the heartbeat
//     timeout (torchrun's c10d store host is the same single point of failure).
class LauncherRendezvous {
 public:
  // Node 0 serves the store; every launcher connects within `timeout`. ember::Error when two
  // launchers claim the same node rank or disagree on the number of workers per node.
  LauncherRendezvous(const std::string& host, int port, int nnodes, int node_rank,
                     int nproc_per_node, std::chrono::milliseconds timeout,
                     const std::string& secret);
  // Elastic mode: serves the store when it can listen on host:port, else joins it within
  // `timeout`. ember::Error when this launcher's settings (workers per node, MIN:MAX, restarts)
  // differ from the master's.
  LauncherRendezvous(const std::string& host, int port, const ElasticOptions& elastic,
                     int nproc_per_node, std::chrono::milliseconds timeout,
                     const std::string& secret);
  ~LauncherRendezvous();
  LauncherRendezvous(const LauncherRendezvous&) = delete;
  LauncherRendezvous& operator=(const LauncherRendezvous&) = delete;

  bool elastic() const { return elastic_; }
  // Whether this launcher serves the store (node 0, the master).
  bool master() const { return master_; }
  // The round this launcher starts at: 0, or for a launcher joining a running elastic job
  // the round being formed.
  int first_round();
  // Elastic: the launchers in `round`, 0 before it closed.
  int nodes_in(int round) { return static_cast<int>(members(round).size()); }
  // Waits for `round` to begin (see above) and returns this launcher's part in it. ember::Error
  // when a launcher recorded a failure instead, when too few launchers came within the
  // timeout, or (elastic) when this launcher was dropped or refused or the store is gone.
  RoundPlan begin_round(int round);
  // Records a failure of `round` seen at `wall_ns` (the system clock, ns since the epoch).
  // `final`: the job ends without a restart (a launcher was stopped by a signal).
  void report_failure(int round, int64_t wall_ns, const std::string& what, bool final = false);
  // Whether a failure of `round` was recorded.
  bool failed(int round);
  // failed(round), for the launcher's watch while the round runs: the elastic master first
  // checks heartbeats and newcomers (recording a lost member or an admitted newcomer as the
  // round's failure). ember::Error (elastic) when this launcher was dropped or the store
  // stopped answering.
  bool poll(int round);
  // True once a launcher recorded a final failure.
  bool stopped();
  // After a failure: counts this launcher's workers as stopped, waits (up to 30 s, or the
  // timeout when shorter) until every launcher's are (but lost ones'), and returns the
  // earliest failure recorded, i.e. the cause (one dead worker soon fails its peers, on every
  // node). The clocks of the nodes should agree (NTP).
  std::string settle_failure(int round);
  // Counts this node's workers of `round` as done; returns how many nodes are.
  int report_done(int round);
  int done(int round);
  // The job ended on this launcher (elastic master: tells the spares still waiting).
  void finish(bool succeeded);
  // Called in every wait (every 20 ms): the launcher's check for a signal, which may throw.
  void set_interrupt(std::function<void()> check) { interrupt_ = std::move(check); }
  // Elastic, not the master: this launcher leaves the job (it was stopped by a signal, or
  // cannot go on, at `wall_ns`). When it is a member of `round`, the leave is recorded as the round's failure
  // (`what`), and the master ends the round without it.
  void leave(int round, int64_t wall_ns, const std::string& what);
  // False (elastic) once this launcher's requests to the store went unanswered or it was
  // dropped from the job: it has nothing more to record there.
  bool can_report();

 private:
  std::string key(int round, const std::string& name) const;
  // Launchers of `round` still expected to settle after a failure: all, but lost ones.
  int64_t expected(int round);
  // The join numbers of `round`'s launchers, by node rank; none before it closed.
  const std::vector<int64_t>& members(int round);
  // The store's requests; on an elastic non-master launcher a store that stopped answering
  // is an ember::Error saying the master launcher is gone (store_gone).
  int64_t add(const std::string& name, int64_t delta);
  void set(const std::string& name, const std::string& value);
  std::string get(const std::string& name);
  Error store_gone(const std::string& why);
  int64_t counter(const std::string& name);
  // How many launchers took a join number (bounded: ember::Error past 2^20).
  int64_t join_count();
  // "the launcher joined as #2 (pid 123 on host)", for messages.
  std::string node_name(int64_t id);
  // Elastic, not the master: ember::Error when the store stopped answering, or this launcher
  // was dropped or refused.
  void check_standing();
  // The interrupt check, then 20 ms of sleep.
  void pause();
  // The heartbeat thread's loop, on beat_store_; records a failed request in store_lost_.
  void heartbeat_loop();
  // Elastic master: marks launchers whose heartbeat stopped, or that left, as lost; returns
  // the new ones, each with whether it left.
  std::vector<std::pair<int64_t, bool>> watch_heartbeats();
  // Elastic master, while `round` runs: records a lost member or a newcomer as its failure.
  void oversee(int round);
  // The master: publishes `round`'s members (`ids`, by node rank) and its workers' port.
  void close_round(int round, const std::vector<int64_t>& ids);

  std::string host_;
  int port_ = 0;
  int nnodes_ = 0, node_rank_ = 0;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStore> store_;
  // elastic
  bool elastic_ = false, master_ = false;
  ElasticOptions e_;
  int64_t id_ = 0;  // join number; the master's is 0
  struct Seen {
    int64_t beats = -1;
    std::chrono::steady_clock::time_point since{};
  };
  std::map<int64_t, Seen> seen_;
  std::set<int64_t> lost_, refused_;
  std::map<int, std::vector<int64_t>> members_;
  int newcomer_round_ = -1;  // the round the master ended for a newcomer
  int64_t wanted_ = 0;       // the round this launcher last asked for, plus 1
  std::map<int64_t, std::string> names_;
  std::unique_ptr<TcpStore> beat_store_;
  std::thread beat_;
  std::mutex beat_mutex_;
  std::condition_variable beat_cv_;
  bool beat_stop_ = false;
  std::string store_lost_;
  bool dropped_ = false;
  std::function<void()> interrupt_;
};

}  // namespace ember::dist::detail

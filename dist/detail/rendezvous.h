// init_process_group's init_method, in one place for every backend that bootstraps through the
// TCP store (TCP, NCCL): the URL parse, who this process is (explicit rank / world size or the
// launcher's), and the rendezvous that finds the store and checks that the ranks agree. Also
// the rendezvous of ember-run's launchers (LauncherRendezvous), which keeps theirs apart.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <ember/dist/init.h>
#include <ember/dist/tcp_store.h>

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
class LauncherRendezvous {
 public:
  // Node 0 serves the store; every launcher connects within `timeout`. ember::Error when two
  // launchers claim the same node rank or disagree on the number of workers per node.
  LauncherRendezvous(const std::string& host, int port, int nnodes, int node_rank,
                     int nproc_per_node, std::chrono::milliseconds timeout,
                     const std::string& secret);
  ~LauncherRendezvous();
  // Waits (up to the timeout) for every launcher to arrive at `round`, then returns the port
  // where this round's workers meet. ember::Error when a launcher recorded a failure instead.
  int begin_round(int round);
  // Records a failure of `round` seen at `wall_ns` (the system clock, ns since the epoch).
  // `final`: the job ends without a restart (a launcher was stopped by a signal).
  void report_failure(int round, int64_t wall_ns, const std::string& what, bool final = false);
  // Whether a failure of `round` was recorded.
  bool failed(int round);
  // True once a launcher recorded a final failure.
  bool stopped();
  // After a failure: counts this launcher's workers as stopped, waits (up to 30 s, or the
  // timeout when shorter) until every launcher's are, and returns the earliest failure
  // recorded, i.e. the cause (one dead worker soon fails its peers, on every node). The clocks
  // of the nodes should agree (NTP).
  std::string settle_failure(int round);
  // Counts this node's workers of `round` as done; returns how many nodes are.
  int report_done(int round);
  int done(int round);

 private:
  std::string key(int round, const std::string& name) const;
  std::string host_;
  int nnodes_, node_rank_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<TcpStore> store_;
};

}  // namespace ember::dist::detail

// init_process_group's init_method, in one place for every backend that bootstraps through the
// TCP store (TCP, NCCL): the URL parse, who this process is (explicit rank / world size or the
// launcher's), and the rendezvous that finds the store and checks that the ranks agree.
#pragma once

#include <chrono>
#include <string>

#include <ember/dist/init.h>

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

}  // namespace ember::dist::detail

// The one TcpStore per MASTER_ADDR:MASTER_PORT and process, shared by every group bootstrapped
// over it (TCP groups, the NCCL unique id): rank 0 can serve a port only once.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include <ember/dist/tcp_store.h>

namespace ember::dist::detail {

// Made on first use (rank 0 serves it) and kept until the process exits; later calls for the
// same address return it whatever their other arguments. Callers that meet under the same key
// more than once number their meetings, e.g. with add("<prefix>/" + rank, 1). `secret` as
// TcpStoreOptions::secret (unset: the environment's).
std::shared_ptr<TcpStore> shared_store(const std::string& host, int port, int world_size, int rank,
                                       std::chrono::milliseconds timeout,
                                       std::optional<std::string> secret = std::nullopt);

// Serves a new store on a free port of `host` (rank 0 of a file:// rendezvous) and registers
// it, so that shared_store(host, store->port(), ...) returns it.
std::shared_ptr<TcpStore> serve_shared_store(const std::string& host, int world_size,
                                             std::chrono::milliseconds timeout,
                                             std::optional<std::string> secret = std::nullopt);
// Unregisters the store served at host:port (a rendezvous that failed after serving it), so
// it closes once its last user lets go.
void forget_shared_store(const std::string& host, int port);

}  // namespace ember::dist::detail

// A small key/value rendezvous over TCP, for bootstrapping when the job was not launched by
// mpirun (the NCCL unique id, the TCP group's listening addresses; one store per process and
// MASTER_PORT, see detail/shared_store.h): rank 0 serves on MASTER_ADDR:MASTER_PORT, and every
// rank (rank 0 included) connects as a client, retrying until the timeout (capped at 30 days).
//
// The server holds up against strangers on its port: requests are bounded (key and value
// lengths, a deadline once a request has started), buffers grow only as bytes arrive, the
// connections it serves are capped, and a connection that breaks the protocol is dropped with
// one line on stderr naming its address. With a job secret (EMBER_JOB_SECRET or
// EMBER_JOB_SECRET_FILE, see detail/auth.h) every connection must first prove it knows the
// secret; without one, anybody who reaches the port can read and write keys.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace ember::dist {

struct TcpStoreOptions {
  // Longest key a request may carry.
  size_t max_key_bytes = 4096;
  // Largest value set() may store; 0: EMBER_STORE_MAX_VALUE_BYTES when set, else 64 MiB.
  size_t max_value_bytes = 0;
  // Connections the server serves at once; at the limit it drops the oldest connection that
  // has made no request yet, or else refuses the new one.
  int max_connections = 1024;
  // A request (or the handshake) that has started must arrive whole within this.
  std::chrono::milliseconds request_timeout = std::chrono::seconds(10);
  // At shutdown the server waits this long at most for clients that have used it to hang up;
  // connections that never made a request are closed at once.
  std::chrono::milliseconds shutdown_grace = std::chrono::seconds(5);
  // A client's longest wait for a reply, after which the request fails ("no reply in time"):
  // a server that stopped (its host gone, its process stopped) is noticed within this. 0: the
  // timeout plus 5 s. A get() of a key not yet set waits on the server: keep it shorter.
  std::chrono::milliseconds reply_timeout = std::chrono::milliseconds(0);
  // The job secret; unset: from the environment (detail::job_secret()); "": none.
  std::optional<std::string> secret;
};

// Thread-safe: one store can serve every group of a process (see detail/shared_store.h).
class TcpStore {
 public:
  // `is_server`: listen on `port` of `host`'s address (port 0: any free port, see port()).
  // Throws ember::Error when the server cannot listen or a client cannot connect in time, or
  // when the server refuses this client's job secret.
  TcpStore(const std::string& host, int port, int world_size, bool is_server,
           std::chrono::milliseconds timeout = std::chrono::minutes(5),
           TcpStoreOptions options = {});
  // The server stays up (within the shutdown grace) until every client that used it has
  // gone, so ranks still reading from it are not cut off.
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  int port() const { return port_; }
  void set(const std::string& key, const std::string& value);
  // Waits for another rank to set `key`; ember::Error after the timeout.
  std::string get(const std::string& key);
  // Adds `delta` to the integer at `key` (0 when absent) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // Returns once all `world_size` ranks have called barrier() as often as this one.
  void barrier();

 private:
  struct Server;
  std::string request(uint8_t op, const std::string& key, const std::string& payload);

  std::string host_;
  int port_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  TcpStoreOptions options_;
  std::unique_ptr<Server> server_;
  std::mutex mutex_;  // one request at a time on fd_
  int fd_ = -1;
  int64_t barriers_ = 0;
};

}  // namespace ember::dist

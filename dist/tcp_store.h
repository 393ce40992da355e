// A small key/value rendezvous over TCP, for bootstrapping when the job was not launched by
// mpirun (the NCCL unique id, the TCP group's listening addresses; one store per process and
// MASTER_PORT, see detail/shared_store.h): rank 0 serves on MASTER_ADDR:MASTER_PORT, and every
// rank (rank 0 included) connects as a client, retrying until the timeout (capped at 30 days).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace ember::dist {

// Thread-safe: one store can serve every group of a process (see detail/shared_store.h).
class TcpStore {
 public:
  // `is_server`: listen on `port` of `host`'s address (port 0: any free port, see port()).
  // Throws ember::Error when the server cannot listen or a client cannot connect in time.
  TcpStore(const std::string& host, int port, int world_size, bool is_server,
           std::chrono::milliseconds timeout = std::chrono::minutes(5));
  // The server stays up until every connected client has gone (or the timeout passes), so
  // ranks still reading from it are never cut off.
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
  std::unique_ptr<Server> server_;
  std::mutex mutex_;  // one request at a time on fd_
  int fd_ = -1;
  int64_t barriers_ = 0;
};

}  // namespace ember::dist

#include "shared_store.h"

#include <map>
#include <mutex>

namespace ember::dist::detail {

std::shared_ptr<TcpStore> shared_store(const std::string& host, int port, int world_size, int rank,
                                       std::chrono::milliseconds timeout) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<TcpStore>> stores;
  std::lock_guard<std::mutex> lock(mutex);
  auto& store = stores[host + ":" + std::to_string(port)];
  if (!store) store = std::make_shared<TcpStore>(host, port, world_size, rank == 0, timeout);
  return store;
}

}  // namespace ember::dist::detail

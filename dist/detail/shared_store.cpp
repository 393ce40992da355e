#include "shared_store.h"

#include <map>
#include <mutex>

namespace ember::dist::detail {

namespace {

struct Stores {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<TcpStore>> by_address;
};
Stores& stores() {
  static Stores instance;
  return instance;
}
std::string address(const std::string& host, int port) { return host + ":" + std::to_string(port); }

}  // namespace

std::shared_ptr<TcpStore> shared_store(const std::string& host, int port, int world_size, int rank,
                                       std::chrono::milliseconds timeout,
                                       std::optional<std::string> secret) {
  Stores& s = stores();
  std::lock_guard<std::mutex> lock(s.mutex);
  auto& store = s.by_address[address(host, port)];
  if (!store)
    store = std::make_shared<TcpStore>(host, port, world_size, rank == 0, timeout,
                                       TcpStoreOptions{.secret = std::move(secret)});
  return store;
}

std::shared_ptr<TcpStore> serve_shared_store(const std::string& host, int world_size,
                                             std::chrono::milliseconds timeout,
                                             std::optional<std::string> secret) {
  auto store = std::make_shared<TcpStore>(host, 0, world_size, true, timeout,
                                          TcpStoreOptions{.secret = std::move(secret)});
  Stores& s = stores();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.by_address[address(host, store->port())] = store;
  return store;
}

void forget_shared_store(const std::string& host, int port) {
  Stores& s = stores();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.by_address.erase(address(host, port));
}

}  // namespace ember::dist::detail

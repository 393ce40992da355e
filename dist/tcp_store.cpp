#include "tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <ember/tensor/error.h>

#include "detail/common.h"
#include "detail/socket.h"

namespace ember::dist {

namespace {

using detail::write_all;

enum Request : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum Reply : uint8_t { kOk = 0, kTimeout = 1, kNotACounter = 2 };

std::string where(const std::string& host, int port) { return host + ":" + std::to_string(port); }

// False on a closed connection; throws on other errors.
bool read_all(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) return false;
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) throw Error("tcp_store: no reply in time");
      return false;
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// Requests and replies go out in one write each: small writes in a row would wait on the
// peer's delayed acknowledgement (Nagle), about 40 ms per request.
void append_blob(std::string& message, const std::string& s) {
  const uint64_t n = s.size();
  message.append(reinterpret_cast<const char*>(&n), sizeof(n));
  message.append(s);
}

bool read_blob(int fd, std::string& s) {
  uint64_t n = 0;
  if (!read_all(fd, &n, sizeof(n))) return false;
  if (n > (uint64_t{1} << 30)) return false;  // not a peer speaking this protocol
  s.resize(n);
  return read_all(fd, s.data(), n);
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &result);
  EMBER_CHECK(rc == 0, "tcp_store", "cannot resolve ", where(host, port), ": ", ::gai_strerror(rc));
  return result;
}

}  // namespace

struct TcpStore::Server {
  int listen_fd = -1;
  int port = 0;
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, std::string> data;
  std::vector<int> clients;
  std::vector<std::thread> threads;
  int active = 0;
  bool stopping = false;
  std::thread acceptor;

  Server(const std::string& host, int requested_port) {
    addrinfo* addresses = resolve(host, requested_port, true);
    std::string last_error = "no address";
    for (addrinfo* a = addresses; a != nullptr && listen_fd < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      const int one = 1;
      ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
        listen_fd = fd;
      } else {
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(addresses);
    EMBER_CHECK(listen_fd >= 0, "tcp_store", "cannot listen on ", where(host, requested_port), ": ",
                last_error);
    port = detail::bound_port(listen_fd);
    acceptor = std::thread([this] { accept_loop(); });
  }

  void accept_loop() {
    for (;;) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      std::lock_guard<std::mutex> lock(mutex);
      if (stopping) {
        if (fd >= 0) ::close(fd);
        return;
      }
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        return;
      }
      clients.push_back(fd);
      ++active;
      threads.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    for (;;) {
      uint8_t op = 0;
      std::string key, payload;
      if (!read_all(fd, &op, 1) || !read_blob(fd, key) || !read_blob(fd, payload)) break;
      std::string value;
      uint8_t status = kOk;
      {
        std::unique_lock<std::mutex> lock(mutex);
        if (op == kSet) {
          data[key] = payload;
          cv.notify_all();
        } else if (op == kAdd) {
          int64_t delta = 0, current = 0;
          std::memcpy(&delta, payload.data(), std::min(payload.size(), sizeof(delta)));
          auto it = data.find(key);
          if (it != data.end() && it->second.size() != sizeof(current)) {
            status = kNotACounter;  // set() stored something else there
          } else {
            if (it != data.end()) std::memcpy(&current, it->second.data(), sizeof(current));
            current += delta;
            data[key] = std::string(reinterpret_cast<const char*>(&current), sizeof(current));
            value = data[key];
            cv.notify_all();
          }
        } else if (op == kGet) {
          int64_t wait_ms = 0;
          std::memcpy(&wait_ms, payload.data(), std::min(payload.size(), sizeof(wait_ms)));
          const bool found = cv.wait_for(lock, std::chrono::milliseconds(wait_ms),
                                         [&] { return stopping || data.count(key) > 0; });
          if (found && data.count(key) > 0) {
            value = data[key];
          } else {
            status = kTimeout;
          }
        } else {
          break;
        }
      }
      std::string reply(1, static_cast<char>(status));
      append_blob(reply, value);
      if (!write_all(fd, reply.data(), reply.size())) break;
    }
    std::lock_guard<std::mutex> lock(mutex);
    --active;
    cv.notify_all();
  }

  ~Server() {
    if (acceptor.joinable()) stop(std::chrono::milliseconds(0));
  }

  void stop(std::chrono::milliseconds grace) {
    {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait_for(lock, grace, [&] { return active == 0; });
      stopping = true;
      for (const int fd : clients) ::shutdown(fd, SHUT_RDWR);
      cv.notify_all();
    }
    ::shutdown(listen_fd, SHUT_RDWR);
    acceptor.join();
    for (auto& t : threads) t.join();
    for (const int fd : clients) ::close(fd);
    ::close(listen_fd);
  }
};

TcpStore::TcpStore(const std::string& host, int port, int world_size, bool is_server,
                   std::chrono::milliseconds timeout)
    : host_(host),
      port_(port),
      world_size_(world_size),
      timeout_(detail::checked_timeout("tcp_store", timeout)) {
  timeout = timeout_;
  EMBER_CHECK(world_size >= 1, "tcp_store", "world size must be at least 1, got ", world_size);
  EMBER_CHECK(port >= 0 && port <= 65535, "tcp_store", "port ", port, " is out of range");
  EMBER_CHECK(is_server || port > 0, "tcp_store", "a client needs the server's port");
  if (is_server) {
    server_ = std::make_unique<Server>(host, port);
    port_ = server_->port;
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  for (auto pause = std::chrono::milliseconds(10);;
       pause = std::min(pause * 2, std::chrono::milliseconds(500))) {
    addrinfo* addresses = resolve(host, port_, false);
    for (addrinfo* a = addresses; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (detail::connect_by(fd, a->ai_addr, a->ai_addrlen, deadline)) {
        fd_ = fd;
      } else {
        last_error = std::strerror(errno);
        ::close(fd);
      }
    }
    ::freeaddrinfo(addresses);
    if (fd_ >= 0) break;
    if (std::chrono::steady_clock::now() + pause > deadline) {
      throw Error("tcp_store: could not connect to " + where(host, port_) + " within " +
                  std::to_string(timeout.count()) + " ms (last error: " + last_error +
                  "); is rank 0 up and MASTER_ADDR/MASTER_PORT right?");
    }
    std::this_thread::sleep_for(pause);
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  // A server that vanished mid-request must not block a client forever.
  const auto limit = timeout + std::chrono::seconds(5);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(limit.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((limit.count() % 1000) * 1000);
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  if (server_) server_->stop(timeout_);
}

std::string TcpStore::request(uint8_t op, const std::string& key, const std::string& payload) {
  uint8_t status = kOk;
  std::string value;
  std::lock_guard<std::mutex> lock(mutex_);
  std::string message(1, static_cast<char>(op));
  append_blob(message, key);
  append_blob(message, payload);
  const bool ok = write_all(fd_, message.data(), message.size()) && read_all(fd_, &status, 1) &&
                  read_blob(fd_, value);
  EMBER_CHECK(ok, "tcp_store", "lost the connection to ", where(host_, port_),
              " (did rank 0 exit?)");
  EMBER_CHECK(status != kNotACounter, "tcp_store", "add: key \"", key,
              "\" holds a value set() stored, not a counter");
  EMBER_CHECK(status == kOk, "tcp_store", "key \"", key, "\" was not set within ", timeout_.count(),
              " ms (waiting at ", where(host_, port_), ")");
  return value;
}

void TcpStore::set(const std::string& key, const std::string& value) { request(kSet, key, value); }

std::string TcpStore::get(const std::string& key) {
  const int64_t wait_ms = timeout_.count();
  return request(kGet, key, std::string(reinterpret_cast<const char*>(&wait_ms), sizeof(wait_ms)));
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const std::string reply =
      request(kAdd, key, std::string(reinterpret_cast<const char*>(&delta), sizeof(delta)));
  int64_t value = 0;
  std::memcpy(&value, reply.data(), std::min(reply.size(), sizeof(value)));
  return value;
}

void TcpStore::barrier() {
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    n = barriers_++;
  }
  const std::string key = "ember/barrier/" + std::to_string(n);
  if (add(key, 1) == world_size_) set(key + "/done", "1");
  get(key + "/done");
}

}  // namespace ember::dist

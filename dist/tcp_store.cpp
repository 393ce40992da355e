#include "tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include <ember/tensor/error.h>

#include "detail/auth.h"
#include "detail/common.h"
#include "detail/socket.h"

namespace ember::dist {

namespace {

using Clock = std::chrono::steady_clock;
using detail::read_by;
using detail::write_all;

enum Request : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
enum Reply : uint8_t { kOk = 0, kTimeout = 1, kNotACounter = 2 };
constexpr size_t kDefaultMaxValue = size_t{64} << 20;
constexpr size_t kChunk = size_t{64} << 10;  // a buffer grows by at most this before the bytes come
constexpr const char* kContext = "ember tcp_store";
// A rank answers the job-secret challenge at once; a stranger that does not is dropped after
// this (or the request timeout, when shorter).
constexpr auto kHandshakeLimit = std::chrono::seconds(3);

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

// The client's read of a reply from its own server: bounded, but without a deadline (the
// socket's receive timeout covers a server that vanished).
bool read_blob(int fd, std::string& s, size_t limit) {
  uint64_t n = 0;
  if (!read_all(fd, &n, sizeof(n)) || n > limit) return false;
  s.clear();
  while (s.size() < n) {
    const size_t old = s.size();
    s.resize(old + std::min<size_t>(kChunk, n - old));
    if (!read_all(fd, s.data() + old, s.size() - old)) return false;
  }
  return true;
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

size_t max_value_bytes(size_t requested) {
  if (requested > 0) return requested;
  const char* text = std::getenv("EMBER_STORE_MAX_VALUE_BYTES");
  if (text == nullptr || text[0] == '\0') return kDefaultMaxValue;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  EMBER_CHECK(errno == 0 && end != text && *end == '\0' && value > 0, "tcp_store",
              "EMBER_STORE_MAX_VALUE_BYTES=\"", text, "\" is not a positive number of bytes");
  return static_cast<size_t>(value);
}

// Why a connection broke the protocol; the server drops it and logs this.
struct ProtocolError {
  std::string reason;
};

}  // namespace

struct TcpStore::Server {
  // An accepted connection that has sent nothing yet: it costs a slot in the acceptor's
  // poll, no thread (a thread costs this process about 200 KB: every library's thread-local
  // storage).
  struct Waiting {
    int fd = -1;
    std::string peer;
    detail::Challenge challenge{};  // with a secret: the nonce it was sent
    Clock::time_point deadline{};   // with a secret: its proof is due by then
  };
  // A connection that has spoken, and the thread that serves it.
  struct Connection {
    int fd = -1;
    std::string peer;
    detail::Challenge challenge{};
    std::thread thread;
    bool done = false;    // its thread has finished with it
    bool member = false;  // it proved the secret or made a well-formed request: a rank
  };

  TcpStoreOptions options;
  std::string secret;
  int listen_fd = -1;
  int port = 0;
  std::string name;  // "tcp_store on port 29500", for the log
  std::mutex mutex;
  std::condition_variable cv;
  std::map<std::string, std::string> data;
  std::list<Connection> connections;
  bool stopping = false;  // accepts nothing more
  bool closing = false;   // after the grace: waiting requests give up
  int wake_fd = -1;       // eventfd: tells the acceptor to stop
  std::thread acceptor;

  Server(const std::string& host, int requested_port, TcpStoreOptions o)
      : options(std::move(o)), secret(detail::secret_or_env(options.secret)) {
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
    name = "tcp_store on port " + std::to_string(port);
    wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    EMBER_CHECK(wake_fd >= 0, "tcp_store", "eventfd failed: ", std::strerror(errno));
    ::fcntl(listen_fd, F_SETFL, ::fcntl(listen_fd, F_GETFL) | O_NONBLOCK);
    acceptor = std::thread([this] { accept_loop(); });
  }

  // Under the lock: joins and forgets the connections whose threads have finished.
  void reap() {
    for (auto it = connections.begin(); it != connections.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      it->thread.join();  // it has left serve() but for returning
      ::close(it->fd);
      it = connections.erase(it);
    }
  }

  // Accepts connections and watches those that have sent nothing yet; a connection gets a
  // thread (serve) once it speaks. Idle connections thus cost no thread, and strangers that
  // never speak are closed at once when the server stops.
  void accept_loop() {
    std::list<Waiting> waiting;
    auto drop = [&](std::list<Waiting>::iterator it, const std::string& why) {
      if (!why.empty()) detail::log_dropped(name, "dropped the connection from " + it->peer + why);
      ::close(it->fd);
      return waiting.erase(it);
    };
    for (;;) {
      std::vector<pollfd> fds{{wake_fd, POLLIN, 0}, {listen_fd, POLLIN, 0}};
      for (const Waiting& w : waiting) fds.push_back({w.fd, POLLIN, 0});
      const int ready = ::poll(fds.data(), fds.size(), 200);
      if (ready < 0 && errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (fds[0].revents != 0) break;  // stop()
      // Connections that spoke get a thread; those whose proof is overdue are dropped.
      const auto now = Clock::now();
      size_t i = 2;
      for (auto it = waiting.begin(); it != waiting.end(); ++i) {
        if (fds[i].revents != 0) {
          std::lock_guard<std::mutex> lock(mutex);
          Connection& c = connections.emplace_back();
          c.fd = it->fd;
          c.peer = std::move(it->peer);
          c.challenge = it->challenge;
          try {
            c.thread = std::thread([this, &c] { serve(c); });
          } catch (const std::system_error& e) {  // no thread to be had: refuse this one
            connections.pop_back();
            it = drop(it, std::string(": no thread to serve it (") + e.what() + ")");
            continue;
          }
          it = waiting.erase(it);
        } else if (!secret.empty() && now > it->deadline) {
          it = drop(it, ": it sent no proof of the job secret in time");
        } else {
          ++it;
        }
      }
      if ((fds[1].revents & POLLIN) == 0) continue;
      for (;;) {
        const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));  // out of files: later
          }
          break;  // EAGAIN: none left; ECONNABORTED: gone already
        }
        const std::string peer = detail::peer_address(fd);
        {
          std::lock_guard<std::mutex> lock(mutex);
          reap();
          if (static_cast<int>(connections.size() + waiting.size()) >= options.max_connections) {
            // Room for the newcomer: the oldest connection that has not spoken, else the
            // oldest served one that has made no request; else it is refused.
            const std::string room = ", which made no request, to make room for " + peer + " (" +
                                     std::to_string(options.max_connections) +
                                     " connections at most)";
            auto idle = std::find_if(connections.begin(), connections.end(),
                                     [](const Connection& c) { return !c.member && !c.done; });
            if (!waiting.empty()) {
              drop(waiting.begin(), room);
            } else if (idle != connections.end()) {
              detail::log_dropped(name, "dropped the connection from " + idle->peer + room);
              ::shutdown(idle->fd, SHUT_RDWR);
            } else {
              detail::log_dropped(name, "refused a connection from " + peer + ": " +
                                            std::to_string(options.max_connections) +
                                            " connections are open, all in use");
              ::close(fd);
              continue;
            }
          }
        }
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        Waiting& w = waiting.emplace_back();
        w.fd = fd;
        w.peer = peer;
        w.deadline = Clock::now() +
                     std::min<std::chrono::milliseconds>(options.request_timeout, kHandshakeLimit);
        bool sent = false;
        try {
          sent = detail::send_challenge(fd, secret, w.challenge);
        } catch (const std::exception& e) {
          detail::log_dropped(name, "dropped the connection from " + peer + ": " + e.what());
        }
        if (!sent) drop(std::prev(waiting.end()), "");
      }
    }
    for (const Waiting& w : waiting) ::close(w.fd);  // they never spoke: closed at once
  }

  // Reads `n` bytes into `s` by `deadline`, growing it as they arrive.
  static void read_growing(int fd, std::string& s, uint64_t n, Clock::time_point deadline,
                           const char* what) {
    s.clear();
    while (s.size() < n) {
      const size_t old = s.size();
      s.resize(old + std::min<size_t>(kChunk, n - old));
      if (!read_by(fd, s.data() + old, s.size() - old, deadline)) {
        throw ProtocolError{std::string(errno == ETIMEDOUT ? "did not send " : "closed before ") +
                            "the " + std::to_string(n) + " bytes of " + what +
                            " it announced in time"};
      }
    }
  }

  static uint64_t read_length(int fd, Clock::time_point deadline, const char* what) {
    uint64_t n = 0;
    if (!read_by(fd, &n, sizeof(n), deadline)) {
      throw ProtocolError{std::string(errno == ETIMEDOUT ? "sent no " : "closed before the ") +
                          "length of " + what + " in time"};
    }
    return n;
  }

  // One request, its first byte `op` read; the rest must come by `deadline`.
  void read_request(int fd, uint8_t op, std::string& key, std::string& payload,
                    Clock::time_point deadline) const {
    if (op != kSet && op != kGet && op != kAdd) {
      throw ProtocolError{"sent request type " + std::to_string(op) + ", which is none"};
    }
    const uint64_t key_bytes = read_length(fd, deadline, "a key");
    if (key_bytes > options.max_key_bytes) {
      throw ProtocolError{"announced a key of " + std::to_string(key_bytes) + " bytes (at most " +
                          std::to_string(options.max_key_bytes) + ")"};
    }
    read_growing(fd, key, key_bytes, deadline, "a key");
    const uint64_t payload_bytes = read_length(fd, deadline, "a value");
    const uint64_t limit = op == kSet ? options.max_value_bytes : sizeof(int64_t);
    if ((op == kSet && payload_bytes > limit) || (op != kSet && payload_bytes != limit)) {
      throw ProtocolError{"announced a value of " + std::to_string(payload_bytes) + " bytes (" +
                          (op == kSet ? "at most " : "expected ") + std::to_string(limit) + ")"};
    }
    read_growing(fd, payload, payload_bytes, deadline, "a value");
  }

  void serve(Connection& c) {
    const int fd = c.fd;
    try {
      const std::string failed =
          detail::finish_accept(fd, secret, kContext, c.challenge,
                                Clock::now() + std::min<std::chrono::milliseconds>(
                                                   options.request_timeout, kHandshakeLimit));
      if (!failed.empty()) throw ProtocolError{failed};
      if (!secret.empty()) {
        std::lock_guard<std::mutex> lock(mutex);
        c.member = true;  // it proved the job's secret: a rank, even before its first request
      }
      for (;;) {
        uint8_t op = 0;
        // Between requests a connection may idle as long as it likes; a started request
        // must arrive whole within the request timeout.
        const ssize_t got = ::recv(fd, &op, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        std::string key, payload;
        read_request(fd, op, key, payload, Clock::now() + options.request_timeout);
        std::string reply = answer(c, op, key, payload);
        if (!write_all(fd, reply.data(), reply.size())) break;
      }
    } catch (const ProtocolError& e) {
      bool quiet = false;
      {
        std::lock_guard<std::mutex> lock(mutex);
        quiet = stopping;
      }
      if (!quiet)
        detail::log_dropped(name, "dropped the connection from " + c.peer + ": it " + e.reason);
    } catch (const std::exception& e) {
      // Out of memory for a value, a failed handshake step: this connection ends, the store
      // and the process go on (an exception leaving the thread would end the process).
      detail::log_dropped(name, "dropped the connection from " + c.peer + ": " + e.what());
    }
    ::shutdown(fd, SHUT_RDWR);  // the peer sees the end now; the fd is closed once reaped
    std::lock_guard<std::mutex> lock(mutex);
    c.done = true;
    cv.notify_all();
  }

  std::string answer(Connection& c, uint8_t op, const std::string& key,
                     const std::string& payload) {
    std::string value;
    uint8_t status = kOk;
    {
      std::unique_lock<std::mutex> lock(mutex);
      c.member = true;
      if (op == kSet) {
        data[key] = payload;
        cv.notify_all();
      } else if (op == kAdd) {
        int64_t delta = 0, current = 0;
        std::memcpy(&delta, payload.data(), sizeof(delta));
        auto it = data.find(key);
        if (it != data.end() && it->second.size() != sizeof(current)) {
          status = kNotACounter;  // set() stored something else there
        } else {
          if (it != data.end()) std::memcpy(&current, it->second.data(), sizeof(current));
          current =
              static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(delta));
          data[key] = std::string(reinterpret_cast<const char*>(&current), sizeof(current));
          value = data[key];
          cv.notify_all();
        }
      } else {
        int64_t wait_ms = 0;
        std::memcpy(&wait_ms, payload.data(), sizeof(wait_ms));
        wait_ms = std::clamp<int64_t>(wait_ms, 0, detail::kLongestTimeout.count());
        const bool found = cv.wait_for(lock, std::chrono::milliseconds(wait_ms),
                                       [&] { return closing || data.count(key) > 0; });
        if (found && data.count(key) > 0) {
          value = data[key];
        } else {
          status = kTimeout;
        }
      }
    }
    std::string reply(1, static_cast<char>(status));
    append_blob(reply, value);
    return reply;
  }

  ~Server() {
    if (acceptor.joinable()) stop();
  }

  // Closes connections that never made a request at once, waits (within the grace) for the
  // rest to hang up, then closes them too.
  void stop() {
    {
      std::unique_lock<std::mutex> lock(mutex);
      stopping = true;
    }
    const uint64_t one = 1;
    const ssize_t written = ::write(wake_fd, &one, sizeof(one));
    (void)written;  // a full counter wakes the acceptor too
    acceptor.join();
    std::unique_lock<std::mutex> lock(mutex);
    for (const Connection& c : connections)
      if (!c.member && !c.done) ::shutdown(c.fd, SHUT_RDWR);
    cv.wait_for(lock, options.shutdown_grace, [&] {
      return std::none_of(connections.begin(), connections.end(),
                          [](const Connection& c) { return c.member && !c.done; });
    });
    closing = true;
    cv.notify_all();
    for (const Connection& c : connections)
      if (!c.done) ::shutdown(c.fd, SHUT_RDWR);
    cv.wait(lock, [&] {
      return std::all_of(connections.begin(), connections.end(),
                         [](const Connection& c) { return c.done; });
    });
    reap();
    ::close(listen_fd);
    ::close(wake_fd);
  }
};

TcpStore::TcpStore(const std::string& host, int port, int world_size, bool is_server,
                   std::chrono::milliseconds timeout, TcpStoreOptions options)
    : host_(host),
      port_(port),
      world_size_(world_size),
      timeout_(detail::checked_timeout("tcp_store", timeout)),
      options_(std::move(options)) {
  timeout = timeout_;
  options_.max_value_bytes = max_value_bytes(options_.max_value_bytes);
  EMBER_CHECK(options_.max_connections >= 1 && options_.request_timeout.count() > 0 &&
                  options_.shutdown_grace.count() >= 0 && options_.reply_timeout.count() >= 0,
              "tcp_store", "max_connections (", options_.max_connections, ") and request_timeout (",
              options_.request_timeout.count(), " ms) must be positive, shutdown_grace (",
              options_.shutdown_grace.count(), " ms) and reply_timeout (",
              options_.reply_timeout.count(), " ms) not negative");
  EMBER_CHECK(world_size >= 1, "tcp_store", "world size must be at least 1, got ", world_size);
  EMBER_CHECK(port >= 0 && port <= 65535, "tcp_store", "port ", port, " is out of range");
  EMBER_CHECK(is_server || port > 0, "tcp_store", "a client needs the server's port");
  if (is_server) {
    server_ = std::make_unique<Server>(host, port, options_);
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
  const auto limit = options_.reply_timeout.count() > 0 ? options_.reply_timeout
                                                        : timeout + std::chrono::seconds(5);
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(limit.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((limit.count() % 1000) * 1000);
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string refused =
      detail::connect_handshake(fd_, detail::secret_or_env(options_.secret), kContext,
                                std::min(deadline, Clock::now() + options_.request_timeout));
  if (!refused.empty()) {
    ::close(fd_);
    fd_ = -1;
    throw Error("tcp_store: the store at " + where(host, port_) + " " + refused);
  }
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  if (server_) server_->stop();
}

std::string TcpStore::request(uint8_t op, const std::string& key, const std::string& payload) {
  EMBER_CHECK(key.size() <= options_.max_key_bytes, "tcp_store", "key of ", key.size(),
              " bytes is longer than the store's limit of ", options_.max_key_bytes);
  EMBER_CHECK(payload.size() <= options_.max_value_bytes, "tcp_store", "value of ", payload.size(),
              " bytes for key \"", key, "\" is larger than the store's limit of ",
              options_.max_value_bytes, " (EMBER_STORE_MAX_VALUE_BYTES raises it on every rank)");
  uint8_t status = kOk;
  std::string value;
  std::lock_guard<std::mutex> lock(mutex_);
  std::string message(1, static_cast<char>(op));
  append_blob(message, key);
  append_blob(message, payload);
  bool ok = false;
  try {
    ok = write_all(fd_, message.data(), message.size()) && read_all(fd_, &status, 1);
    if (ok && status <= kNotACounter) ok = read_blob(fd_, value, options_.max_value_bytes);
  } catch (const Error&) {  // the receive timeout: a server that stopped answering
    ::close(fd_);           // a late reply must not pass for the next request's
    fd_ = -1;
    throw Error("tcp_store: the store at " + where(host_, port_) +
                " sent no reply to a request for \"" + key +
                "\" in time (it stopped answering: its host or process is gone or stopped)");
  }
  if (!ok || status > kNotACounter) {  // what is left of this reply must not be read as the next
    ::close(fd_);
    fd_ = -1;
  }
  // A store that wants a job secret greets with its challenge ("EMBA...") instead.
  EMBER_CHECK(!ok || status <= kNotACounter, "tcp_store", "the store at ", where(host_, port_),
              " answered with something other than a reply: it wants a job secret "
              "(EMBER_JOB_SECRET) that this process lacks, or it is no ember store");
  EMBER_CHECK(ok, "tcp_store", "lost the connection to ", where(host_, port_),
              " (did rank 0 exit? or does it want a job secret, EMBER_JOB_SECRET, that this "
              "process lacks?)");
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

// The TCP rendezvous over loopback, with threads standing in for ranks.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include <ember/dist/detail/auth.h>
#include <ember/dist/detail/rendezvous.h>
#include <ember/dist/detail/supervisor.h>
#include <ember/dist/tcp_process_group.h>
#include <ember/dist/tcp_store.h>
#include <ember/tensor/ops.h>

#include "dist_test_util.h"

namespace ember::dist {
namespace {

using namespace std::chrono_literals;

using testing::free_port;

// A loopback listener that nobody accepts from (the kernel completes up to `backlog`
// connections itself); its port in `port`.
int silent_listener(int backlog, int& port) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(::listen(listener, backlog), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  port = ntohs(addr.sin_port);
  return listener;
}

// The sockets open in this process that a child started with exec would inherit.
std::vector<std::string> inheritable_sockets() {
  std::vector<std::string> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (error || !target.starts_with("socket:")) continue;
    const int fd = std::stoi(entry.path().filename().string());
    const int flags = ::fcntl(fd, F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) found.push_back(target);
  }
  return found;
}

TEST(TcpStore, SocketsAreClosedOnExec) {
  // A training script that starts a subprocess must not hand it the rendezvous sockets.
  // (The launcher's own sockets, under mpirun or srun, are not ember's to change.)
  const std::vector<std::string> before = inheritable_sockets();
  TcpStore server("127.0.0.1", 0, 2, true, 10s);
  TcpStore client("127.0.0.1", server.port(), 2, false, 10s);
  client.set("ready", "1");
  EXPECT_EQ(server.get("ready"), "1");
  EXPECT_EQ(inheritable_sockets(), before);
}

TEST(TcpStore, SetGetAddAndBarrierAcrossRanks) {
  constexpr int kWorld = 3;
  TcpStore server("127.0.0.1", 0, kWorld, true, 10s);
  ASSERT_GT(server.port(), 0);
  std::atomic<int> after_barrier{0};
  std::vector<std::string> got(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 1; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      TcpStore client("127.0.0.1", server.port(), kWorld, false, 10s);
      got[static_cast<size_t>(r)] = client.get("id");  // waits for rank 0's set
      client.add("count", r);
      client.barrier();
      after_barrier.fetch_add(1);
      client.barrier();
    });
  }
  std::this_thread::sleep_for(50ms);
  server.set("id", std::string("\0bytes\xff", 7));
  server.add("count", 10);
  server.barrier();
  // Every rank has added before anyone leaves the first barrier.
  EXPECT_EQ(server.add("count", 0), 13);
  server.barrier();
  EXPECT_EQ(after_barrier.load(), kWorld - 1);
  for (auto& t : ranks) t.join();
  for (int r = 1; r < kWorld; ++r)
    EXPECT_EQ(got[static_cast<size_t>(r)], std::string("\0bytes\xff", 7));
}

TEST(TcpStore, OneStoreServesManyThreads) {
  // Every group of a process shares one store (detail::shared_store): requests made from
  // several threads at once must not interleave on its one connection.
  TcpStore store("127.0.0.1", 0, 1, true, 10s);
  constexpr int kThreads = 4, kRounds = 200;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < kRounds; ++i) {
          store.add("count", 1);
          const std::string value(static_cast<size_t>(1 + i), static_cast<char>('a' + t));
          store.set("thread/" + std::to_string(t), value);
          if (store.get("thread/" + std::to_string(t)) != value) ++failures;
        }
      } catch (const std::exception&) {
        ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store.add("count", 0), kThreads * kRounds);
}

TEST(TcpStore, GetTimesOutOnAMissingKey) {
  TcpStore server("127.0.0.1", 0, 1, true, 300ms);
  EXPECT_EMBER_ERROR(server.get("never"), "tcp_store: key \"never\" was not set within 300 ms");
  server.set("k", "v");  // still usable
  EXPECT_EQ(server.get("k"), "v");
}

TEST(TcpStore, AddRefusesAValueThatIsNotACounter) {
  TcpStore server("127.0.0.1", 0, 1, true, 300ms);
  server.set("name", "ab");  // shorter than a counter: add must not read past it
  EXPECT_EMBER_ERROR(server.add("name", 1),
                     "tcp_store: add: key \"name\" holds a value set() stored, not a counter");
  EXPECT_EQ(server.get("name"), "ab");  // untouched
  EXPECT_EQ(server.add("count", 2), 2);
  EXPECT_EQ(server.add("count", 3), 5);
}

TEST(TcpStore, NeverTimingOutIsAllowed) {
  // milliseconds::max() is capped, not overflowed into an instant timeout.
  TcpStore server("127.0.0.1", 0, 1, true, std::chrono::milliseconds::max());
  server.set("k", "v");
  EXPECT_EQ(server.get("k"), "v");
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", 0, 1, true, 0ms), "timeout must be positive");
}

TEST(TcpStore, ClientRetriesUntilTheServerComesUp) {
  const int port = free_port();
  std::string got;
  std::thread client([&] {
    TcpStore store("127.0.0.1", port, 2, false, 10s);
    got = store.get("hello");
  });
  std::this_thread::sleep_for(300ms);
  TcpStore server("127.0.0.1", port, 2, true, 10s);
  server.set("hello", "world");
  client.join();
  EXPECT_EQ(got, "world");
}

TEST(TcpStore, ConnectGivesUpAfterTheTimeout) {
  const int port = free_port();
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", port, 2, false, 300ms),
                     "could not connect to 127.0.0.1:" + std::to_string(port) + " within 300 ms");
}

TEST(TcpStore, ConnectToAHostThatNeverAnswersGivesUpAtTheTimeout) {
  // A listener that never accepts, its queue filled: further connection attempts get no
  // answer at all (the kernel drops their SYNs), like a host behind a firewall.
  int port = 0;
  const int listener = silent_listener(0, port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::vector<int> queued;
  for (int i = 0; i < 2; ++i) {
    queued.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    ::connect(queued.back(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  std::this_thread::sleep_for(50ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", port, 2, false, 500ms),
                     "could not connect to 127.0.0.1:");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // not the kernel's minutes
  for (const int fd : queued) ::close(fd);
  ::close(listener);
}

// A store whose process stopped (SIGSTOP, a frozen host) keeps its connections open but never
// answers: reply_timeout bounds the wait, and the connection is not used again.
TEST(TcpStore, AServerThatStopsAnsweringFailsARequestAtTheReplyTimeout) {
  int port = 0;
  const int listener = silent_listener(4, port);  // connections complete; nobody reads
  TcpStore store("127.0.0.1", port, 2, false, 10s,
                 TcpStoreOptions{.reply_timeout = 300ms, .secret = ""});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EMBER_ERROR(store.add("ember/k", 1), "the store at 127.0.0.1:" + std::to_string(port) +
                                                  " sent no reply to a request for \"ember/k\" "
                                                  "in time");
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_GE(waited, 250ms);
  EXPECT_LT(waited, 5s);  // not the timeout plus 5 s
  EXPECT_EMBER_ERROR(store.set("ember/k", "v"), "lost the connection to 127.0.0.1:");
  EXPECT_EMBER_ERROR(
      TcpStore("127.0.0.1", port, 2, false, 1s,
               TcpStoreOptions{.reply_timeout = std::chrono::milliseconds(-1), .secret = ""}),
      "reply_timeout (-1 ms) not negative");
  ::close(listener);
}

TEST(TcpStore, ArgumentErrors) {
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", 0, 2, false, 100ms), "a client needs the server's port");
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", 70000, 2, true, 100ms), "port 70000 is out of range");
  EXPECT_EMBER_ERROR(TcpStore("no-such-host.invalid", 1234, 2, false, 100ms), "cannot resolve");
}

// --- strangers on the store's port ----------------------------------------------------------

// A raw connection to the store on 127.0.0.1, as a stranger makes it.
int raw_connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  return fd;
}

void send_bytes(int fd, const std::string& bytes) {
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
}

std::string u64(uint64_t n) { return std::string(reinterpret_cast<const char*>(&n), sizeof(n)); }

// A request as the store's protocol frames it: type, key length, key, value length, value.
std::string frame(uint8_t op, const std::string& key, const std::string& value) {
  return std::string(1, static_cast<char>(op)) + u64(key.size()) + key + u64(value.size()) + value;
}

// True once the server has closed `fd` (reads reach the end), false after `limit`.
bool closed_by_server(int fd, std::chrono::milliseconds limit) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(limit.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((limit.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buffer[256];
  for (;;) {
    const ssize_t got = ::recv(fd, buffer, sizeof(buffer), 0);
    if (got == 0) return true;
    if (got < 0) return errno == ECONNRESET;
  }
}

int64_t rss_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TcpStoreOptions quick_options() {
  TcpStoreOptions options;
  options.request_timeout = 300ms;
  options.shutdown_grace = 500ms;
  options.secret = "";
  return options;
}

TEST(TcpStore, BrokenRequestsAreDroppedAndLoggedWithoutHarm) {
  TcpStore server("127.0.0.1", 0, 1, true, 10s, quick_options());
  server.set("key", "value");
  const int64_t rss_before = rss_kib();
  std::mt19937 random(7);
  std::string noise(4096, '\0');
  for (char& c : noise) c = static_cast<char>(random());
  const std::vector<std::string> strangers = {
      noise,                                                  // random bytes
      std::string(1, '\x09'),                                 // no such request
      std::string(1, '\x01') + u64(uint64_t{1} << 30) + "k",  // a 1 GiB key, announced
      std::string(1, '\x01') + u64(3) + "key" + u64(uint64_t{1} << 30) + "v",  // a 1 GiB value
      std::string(1, '\x01') + u64(5) + "ke",                    // truncated, then silence
      std::string(1, '\x03') + u64(3) + "key" + u64(3) + "abc",  // add without a counter
  };
  ::testing::internal::CaptureStderr();
  std::vector<int> fds;
  for (const auto& bytes : strangers) {
    fds.push_back(raw_connect(server.port()));
    send_bytes(fds.back(), bytes);
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    SCOPED_TRACE("stranger " + std::to_string(i));
    EXPECT_TRUE(closed_by_server(fds[i], 3s));  // each within the request timeout
    ::close(fds[i]);
  }
  std::this_thread::sleep_for(50ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("tcp_store on port " + std::to_string(server.port()) +
                     ": dropped the connection from 127.0.0.1:"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("sent request type 9, which is none"), std::string::npos) << log;
  EXPECT_NE(log.find("announced a key of 1073741824 bytes (at most 4096)"), std::string::npos)
      << log;
  EXPECT_NE(log.find("announced a value of 1073741824 bytes (at most 67108864)"), std::string::npos)
      << log;
  EXPECT_NE(log.find("did not send the 5 bytes of a key it announced in time"), std::string::npos)
      << log;
  EXPECT_NE(log.find("announced a value of 3 bytes (expected 8)"), std::string::npos) << log;
  EXPECT_LT(rss_kib() - rss_before, 32 * 1024);  // nothing sized from the announced lengths
  EXPECT_EQ(server.get("key"), "value");         // the store never noticed
  EXPECT_EQ(server.add("n", 2), 2);
}

TEST(TcpStore, AStartedRequestMustArriveWithinTheRequestTimeout) {
  TcpStore server("127.0.0.1", 0, 1, true, 1s, quick_options());
  const int fd = raw_connect(server.port());
  ::testing::internal::CaptureStderr();
  const auto start = std::chrono::steady_clock::now();
  send_bytes(fd, std::string(1, '\x01') + u64(1) + "k" + u64(1 << 20) + std::string(1000, 'x'));
  EXPECT_TRUE(closed_by_server(fd, 5s));
  const auto took = std::chrono::steady_clock::now() - start;
  ::testing::internal::GetCapturedStderr();
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 2s);
  ::close(fd);
  EXPECT_EMBER_ERROR(server.get("k"), "was not set");  // the half-sent value was never stored
}

TEST(TcpStore, IdleConnectionsNeverHoldTheServersShutdown) {
  // A port scan, a health check, a client left from an earlier job: connections that never
  // make a request are closed at once when rank 0 exits.
  auto options = quick_options();
  options.shutdown_grace = 5s;
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, 2, true, 60s, options);
  {
    TcpStore rank1("127.0.0.1", server->port(), 2, false, 60s, options);
    rank1.set("done", "1");
  }  // rank 1 used the store and hung up
  const int64_t rss_before = rss_kib();
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) idle.push_back(raw_connect(server->port()));
  std::this_thread::sleep_for(100ms);
  // Connections that say nothing cost no thread (each would cost ~200 KB of this process's
  // thread-local storage).
  EXPECT_LT(rss_kib() - rss_before, 8 * 1024);
  const auto start = std::chrono::steady_clock::now();
  server.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 1s);
  for (const int fd : idle) {
    EXPECT_TRUE(closed_by_server(fd, 1s));
    ::close(fd);
  }
}

TEST(TcpStore, ShutdownWaitsForARankStillConnectedOnlyWithinTheGrace) {
  auto options = quick_options();
  options.shutdown_grace = 600ms;
  auto server = std::make_unique<TcpStore>("127.0.0.1", 0, 2, true, 60s, options);
  std::string got;
  std::thread rank1([&] {
    TcpStore client("127.0.0.1", server->port(), 2, false, 60s, options);
    client.add("joined", 1);
    std::this_thread::sleep_for(200ms);  // rank 0 starts shutting down meanwhile
    got = client.get("late");            // still served: set by rank 0 before it exits
  });
  while (server->add("joined", 0) == 0) std::this_thread::sleep_for(5ms);
  server->set("late", "ok");
  const auto start = std::chrono::steady_clock::now();
  server.reset();  // waits for rank 1 to hang up, which it does after its get
  rank1.join();
  EXPECT_EQ(got, "ok");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 600ms + 500ms);

  // A client that stays connected past the grace is cut off then.
  server = std::make_unique<TcpStore>("127.0.0.1", 0, 2, true, 60s, options);
  TcpStore stays("127.0.0.1", server->port(), 2, false, 60s, options);
  stays.set("x", "1");
  const auto again = std::chrono::steady_clock::now();
  server.reset();
  const auto took = std::chrono::steady_clock::now() - again;
  EXPECT_GE(took, 500ms);
  EXPECT_LT(took, 2s);
  EXPECT_EMBER_ERROR(stays.get("x"), "lost the connection");
}

TEST(TcpStore, AtTheConnectionCapIdleStrangersMakeRoomForRanks) {
  auto options = quick_options();
  options.max_connections = 4;
  TcpStore server("127.0.0.1", 0, 2, true, 10s, options);  // its own client is one
  server.set("rank 0", "here");
  ::testing::internal::CaptureStderr();
  std::vector<int> idle;
  for (int i = 0; i < 6; ++i) idle.push_back(raw_connect(server.port()));
  std::this_thread::sleep_for(100ms);
  TcpStore rank1("127.0.0.1", server.port(), 2, false, 10s, options);
  rank1.set("from", "rank 1");
  EXPECT_EQ(server.get("from"), "rank 1");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("which made no request, to make room for 127.0.0.1:"), std::string::npos)
      << log;
  for (const int fd : idle) ::close(fd);
}

TEST(TcpStore, ValuesOverTheLimitAreRefusedByName) {
  auto options = quick_options();
  options.max_value_bytes = 1024;
  TcpStore server("127.0.0.1", 0, 1, true, 10s, options);
  EXPECT_EMBER_ERROR(
      server.set("big", std::string(2000, 'x')),
      "value of 2000 bytes for key \"big\" is larger than the store's limit of 1024");
  EXPECT_EMBER_ERROR(server.set(std::string(5000, 'k'), "v"),
                     "key of 5000 bytes is longer than the store's limit of 4096");
  server.set("small", std::string(1024, 'x'));
  EXPECT_EQ(server.get("small").size(), 1024u);
}

// --- the job secret ---------------------------------------------------------------------------

TcpStoreOptions with_secret(const std::string& secret) {
  auto options = quick_options();
  options.secret = secret;
  return options;
}

TEST(TcpStore, WithASecretOnlyClientsThatKnowItAreServed) {
  for (const int world : {2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    TcpStore server("127.0.0.1", 0, world, true, 10s, with_secret("right"));
    server.set("victim", "real");
    server.add("count", 5);
    std::vector<std::thread> ranks;
    for (int r = 1; r < world; ++r) {
      ranks.emplace_back([&] {
        TcpStore client("127.0.0.1", server.port(), world, false, 10s, with_secret("right"));
        EXPECT_EQ(client.get("victim"), "real");
        client.barrier();
      });
    }
    server.barrier();
    for (auto& t : ranks) t.join();

    ::testing::internal::CaptureStderr();
    // A wrong secret: refused during the handshake, before any request.
    EXPECT_EMBER_ERROR(
        TcpStore("127.0.0.1", server.port(), world, false, 10s, with_secret("wrong")),
        "refused this process's job secret");
    // No secret: its forged set and add are read as a failed handshake and dropped.
    {
      TcpStore forger("127.0.0.1", server.port(), world, false, 10s, with_secret(""));
      EXPECT_EMBER_ERROR(forger.set("victim", "forged"),
                         "wants a job secret (EMBER_JOB_SECRET) that this process lacks");
    }
    for (const auto& forged : {frame(1, "victim", "forged"), frame(3, "count", u64(100)),
                               frame(1, "victim", std::string(100, 'f'))}) {
      const int fd = raw_connect(server.port());
      send_bytes(fd, forged);
      EXPECT_TRUE(closed_by_server(fd, 3s));
      ::close(fd);
    }
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(log.find("dropped the connection from 127.0.0.1:"), std::string::npos) << log;
    EXPECT_NE(log.find("failed the job-secret handshake"), std::string::npos) << log;
    EXPECT_EQ(server.get("victim"), "real");  // no forged request changed a key
    EXPECT_EQ(server.add("count", 0), 5);
  }
}

TEST(TcpStore, ASecretAgainstAServerWithoutOneSaysSo) {
  TcpStore server("127.0.0.1", 0, 2, true, 10s, with_secret(""));
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", server.port(), 2, false, 10s, with_secret("s")),
                     "sent no job-secret challenge in time (is the same EMBER_JOB_SECRET set");
}

TEST(JobSecret, TheHandshakeProvesTheSecretBothWaysAndCarriesTheFirstMessage) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  auto run = [&](const std::string& acceptor_secret, const std::string& connector_secret) {
    int pair[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
    std::string accepted, greeting(5, '\0');
    std::thread acceptor([&] {
      accepted = detail::accept_handshake(pair[0], acceptor_secret, "test", deadline);
      if (accepted.empty()) detail::read_by(pair[0], greeting.data(), greeting.size(), deadline);
      ::close(pair[0]);
    });
    const std::string connected =
        detail::connect_handshake(pair[1], connector_secret, "test", deadline, "hello");
    acceptor.join();
    ::close(pair[1]);
    return std::tuple{accepted, connected, greeting};
  };
  auto [accepted, connected, greeting] = run("s3cret", "s3cret");
  EXPECT_EQ(accepted, "");
  EXPECT_EQ(connected, "");
  EXPECT_EQ(greeting, "hello");
  std::tie(accepted, connected, greeting) = run("s3cret", "other");
  EXPECT_EQ(accepted, "failed the job-secret handshake (wrong secret, or none)");
  EXPECT_EQ(connected, "refused this process's job secret (the secrets differ)");
  std::tie(accepted, connected, greeting) = run("", "");  // no secret: nothing but the message
  EXPECT_EQ(accepted, "");
  EXPECT_EQ(greeting, "hello");
}

TEST(JobSecret, ReadFromTheVariableOrAFile) {
  ::unsetenv("EMBER_JOB_SECRET");
  ::unsetenv("EMBER_JOB_SECRET_FILE");
  EXPECT_EQ(detail::read_job_secret(), "");
  ::setenv("EMBER_JOB_SECRET", "inline", 1);
  EXPECT_EQ(detail::read_job_secret(), "inline");
  const std::string path = ::testing::TempDir() + "ember_job_secret_" + std::to_string(::getpid());
  std::ofstream(path) << "from a file\n";
  ::setenv("EMBER_JOB_SECRET_FILE", path.c_str(), 1);
  EXPECT_EMBER_ERROR(detail::read_job_secret(), "EMBER_JOB_SECRET and EMBER_JOB_SECRET_FILE");
  ::unsetenv("EMBER_JOB_SECRET");
  EXPECT_EQ(detail::read_job_secret(), "from a file");
  std::ofstream(path) << "";
  EXPECT_EMBER_ERROR(detail::read_job_secret(), "is empty");
  std::ofstream(path) << std::string(70000, 'x');
  EXPECT_EMBER_ERROR(detail::read_job_secret(), "holds 70000 bytes (a secret has at most 65536)");
  std::filesystem::remove(path);
  EXPECT_EMBER_ERROR(detail::read_job_secret(), "cannot read EMBER_JOB_SECRET_FILE=");
  ::setenv("EMBER_JOB_SECRET_FILE", "/dev/zero", 1);  // would grow without end
  EXPECT_EMBER_ERROR(detail::read_job_secret(), "/dev/zero: it is not a regular file");
  ::unsetenv("EMBER_JOB_SECRET_FILE");
}

// --- strangers at the TCP backend's mesh listener ---------------------------------------------

TEST(TcpMesh, AStrangerAtAListenerIsDroppedAndTheRankItWaitsForStillJoins) {
  const int port = free_port();
  ::testing::internal::CaptureStderr();
  std::vector<float> sums(2, 0.0f);
  std::thread rank0([&] {
    TcpProcessGroup pg("127.0.0.1", port, 0, 2, 0, {.timeout = 20s});
    Tensor t = full({3}, 1.0, kF32);
    pg.allreduce(t)->wait();
    sums[0] = t.sum().item<float>();
  });
  {
    // The stranger reads rank 0's mesh address from the store, as anyone can without a
    // secret, and greets the listener wrongly, then not at all.
    TcpStore peek("127.0.0.1", port, 2, false, 20s, quick_options());
    const std::string where = peek.get("ember/tcp/1/0");
    const int listener_port = std::stoi(where.substr(where.find(' ') + 1));
    for (const std::string& greeting : {std::string(16, 'x'), std::string()}) {
      const int fd = raw_connect(listener_port);
      send_bytes(fd, greeting);
      ::close(fd);
    }
  }
  std::thread rank1([&] {
    TcpProcessGroup pg("127.0.0.1", port, 1, 2, 1, {.timeout = 20s});
    Tensor t = full({3}, 2.0, kF32);
    pg.allreduce(t)->wait();
    sums[1] = t.sum().item<float>();
  });
  rank0.join();
  rank1.join();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(sums[0], 9.0f);
  EXPECT_EQ(sums[1], 9.0f);
  EXPECT_NE(log.find("TcpProcessGroup rank 0 (group 1): dropped a connection from 127.0.0.1:"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("sent an unexpected greeting"), std::string::npos) << log;
}

// Without a job secret anybody who reaches ember-run's store can write its keys: a forged
// failure count and record end in an ember::Error naming the key, never a crash or a wait on
// records that do not exist.
TEST(LauncherRendezvous, ForgedRecordsAreRefusedByName) {
  const int port = detail::pick_free_port("127.0.0.1");
  detail::LauncherRendezvous launchers("127.0.0.1", port, 1, 0, 1, 10s, "");
  TcpStore stranger("127.0.0.1", port, 1, false, 5s, TcpStoreOptions{.secret = ""});
  stranger.add("ember-run/round/0/failures", 1000000);
  stranger.set("ember-run/round/0/failure/1", "soon it broke");
  EXPECT_EMBER_ERROR(launchers.settle_failure(0),
                     "the launchers' store holds \"soon\" at ember-run/round/0/failure/1");
}

// Elastic mode: the master scans the join numbers the store counts; a forged count is refused
// by name before anything is sized or scanned from it.
TEST(LauncherRendezvous, ElasticForgedCountsAreRefusedByName) {
  const int port = detail::pick_free_port("127.0.0.1");
  detail::ElasticOptions elastic;
  elastic.max_nodes = 2;
  detail::LauncherRendezvous master("127.0.0.1", port, elastic, 1, 10s, "");
  ASSERT_TRUE(master.master());
  TcpStore stranger("127.0.0.1", port, 1, false, 5s, TcpStoreOptions{.secret = ""});
  stranger.add("ember-run/ids", int64_t{1} << 40);
  EXPECT_EMBER_ERROR(master.begin_round(0),
                     "the launchers' store holds 1099511627776 at ember-run/ids");
}

}  // namespace
}  // namespace ember::dist

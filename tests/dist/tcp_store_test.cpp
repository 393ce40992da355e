// The TCP rendezvous over loopback, with threads standing in for ranks.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <vector>

#include <ember/dist/tcp_store.h>

#include "test_util.h"

namespace ember::dist {
namespace {

using namespace std::chrono_literals;

// A port nothing listens on right now.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length);
  ::close(fd);
  return ntohs(addr.sin_port);
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
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  socklen_t length = sizeof(addr);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  std::vector<int> queued;
  for (int i = 0; i < 2; ++i) {
    queued.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
    ::connect(queued.back(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }
  std::this_thread::sleep_for(50ms);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", ntohs(addr.sin_port), 2, false, 500ms),
                     "could not connect to 127.0.0.1:");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);  // not the kernel's minutes
  for (const int fd : queued) ::close(fd);
  ::close(listener);
}

TEST(TcpStore, ArgumentErrors) {
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", 0, 2, false, 100ms), "a client needs the server's port");
  EXPECT_EMBER_ERROR(TcpStore("127.0.0.1", 70000, 2, true, 100ms), "port 70000 is out of range");
  EXPECT_EMBER_ERROR(TcpStore("no-such-host.invalid", 1234, 2, false, 100ms), "cannot resolve");
}

}  // namespace
}  // namespace ember::dist

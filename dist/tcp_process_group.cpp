#include "tcp_process_group.h"

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
#include <atomic>
#include <cerrno>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <type_traits>

#include <ember/dist/flight_recorder.h>
#include <ember/tensor/detail/dispatch.h>

#include "detail/auth.h"
#include "detail/common.h"
#include "detail/engine.h"
#include "detail/flight.h"
#include "detail/scheduler.h"
#include "detail/shared_store.h"
#include "detail/socket.h"

namespace ember::dist {

using detail::FdGuard;
using detail::Fingerprint;
using detail::OpKind;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint32_t kMagic = 0x454d4252;    // "EMBR"
constexpr int32_t kFingerprintKind = 100;  // the exchange that precedes every collective
constexpr int64_t kChunkBytes = int64_t{1} << 20;
constexpr auto kPollSlice = std::chrono::milliseconds(200);
constexpr auto kSpin = std::chrono::microseconds(30);  // transfer() polls without sleeping
// How often the send/recv thread looks for peers' requests for flight records, and how long a
// rank whose group broke waits for the peers' answers.
constexpr auto kDumpCheck = std::chrono::milliseconds(250);
constexpr auto kDumpWait = std::chrono::milliseconds(600);
// A connection to a mesh listener must finish its handshake and greeting within this.
constexpr auto kGreetingLimit = std::chrono::seconds(5);
constexpr const char* kMeshContext = "ember tcp mesh";
enum Channel : int32_t { kCollectives = 0, kPointToPoint = 1 };

// Leads every message; the receiver checks it against what it expects.
struct Header {
  uint32_t magic = kMagic;
  int32_t kind = 0;
  int64_t seq = 0;
  int32_t step = 0;  // collectives: ring step; send/recv: the tag
  int32_t dtype = 0;
  int64_t bytes = 0;
};
static_assert(sizeof(Header) == 32);

// The first bytes on every connection: who connects, for which group and channel.
struct Hello {
  uint32_t magic = kMagic;
  int32_t group = 0;
  int32_t rank = 0;
  int32_t channel = 0;
};

std::string kind_name(int32_t kind) {
  if (kind == kFingerprintKind) return "fingerprint exchange";
  if (kind < 0 || kind > static_cast<int32_t>(OpKind::kRecv)) return "kind " + std::to_string(kind);
  return detail::op_kind_name(static_cast<OpKind>(kind));
}

std::string describe(const Header& h) {
  if (h.magic != kMagic) return "bytes that are no ember message";
  const bool p2p = h.kind == static_cast<int32_t>(OpKind::kSend);
  const std::string dtype = h.dtype >= 0 && h.dtype < kNumDTypes
                                ? std::string(dtype_name(static_cast<DType>(h.dtype)))
                                : "dtype " + std::to_string(h.dtype);
  return kind_name(h.kind) + " #" + std::to_string(h.seq) + " (" + (p2p ? "tag " : "step ") +
         std::to_string(h.step) + ", " + std::to_string(h.bytes) + " bytes of " + dtype + ")";
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::clamp<int64_t>(left.count(), 0, kPollSlice.count()));
}

// The address of this host on the route to `host` (a UDP connect sends nothing).
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  EMBER_CHECK(rc == 0, "TcpProcessGroup", "cannot resolve MASTER_ADDR ", host, ": ",
              ::gai_strerror(rc));
  FdGuard fd{::socket(found->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0)};
  const bool routed = fd.fd >= 0 && ::connect(fd.fd, found->ai_addr, found->ai_addrlen) == 0;
  ::freeaddrinfo(found);
  EMBER_CHECK(routed, "TcpProcessGroup", "no route to MASTER_ADDR ", host, ": ",
              std::strerror(errno));
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  ::getsockname(fd.fd, reinterpret_cast<sockaddr*>(&local), &length);
  char text[INET6_ADDRSTRLEN] = {};
  const void* address =
      local.ss_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr);
  ::inet_ntop(local.ss_family, address, text, sizeof(text));
  return text;
}

addrinfo* resolve_numeric(const std::string& address, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | (passive ? AI_PASSIVE : 0);
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(address.c_str(), std::to_string(port).c_str(), &hints, &found);
  EMBER_CHECK(rc == 0, "TcpProcessGroup", "bad address ", address, ": ", ::gai_strerror(rc));
  return found;
}

// Listens on an ephemeral port of `address`; returns the socket and sets `port`.
int listen_on(const std::string& address, int& port) {
  addrinfo* found = resolve_numeric(address, 0, true);
  const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok =
      fd >= 0 && ::bind(fd, found->ai_addr, found->ai_addrlen) == 0 && ::listen(fd, 256) == 0;
  const int error = errno;
  ::freeaddrinfo(found);
  if (!ok && fd >= 0) ::close(fd);
  EMBER_CHECK(ok, "TcpProcessGroup", "cannot listen on ", address, ": ", std::strerror(error));
  port = detail::bound_port(fd);
  return fd;
}

// Connects to a peer's listener, retrying until `deadline`.
int connect_to(const std::string& address, int port, int peer, Clock::time_point deadline) {
  std::string last_error;
  for (auto pause = std::chrono::milliseconds(5);;
       pause = std::min(pause * 2, std::chrono::milliseconds(200))) {
    addrinfo* found = resolve_numeric(address, port, false);
    const int fd = ::socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool ok = fd >= 0 && detail::connect_by(fd, found->ai_addr, found->ai_addrlen, deadline);
    last_error = std::strerror(errno);
    ::freeaddrinfo(found);
    if (ok) return fd;
    if (fd >= 0) ::close(fd);
    EMBER_CHECK(Clock::now() + pause < deadline, "TcpProcessGroup", "cannot connect to rank ", peer,
                " at ", address, ":", port, " (", last_error, ")");
    std::this_thread::sleep_for(pause);
  }
}

// dst[i] = dst[i] (op) src[i]; f16 and bf16 in float, bool as or (sum, max) and and (min).
template <typename T>
bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(v);
  } else {
    return false;
  }
}

template <typename T>
void combine_typed(void* dst, const void* src, int64_t n, ReduceOp op) {
  auto* d = static_cast<T*>(dst);
  const auto* s = static_cast<const T*>(src);
  using Math = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
  for (int64_t i = 0; i < n; ++i) {
    const Math a = static_cast<Math>(s[i]), b = static_cast<Math>(d[i]);
    Math r;
    if (op == ReduceOp::kMax) {
      r = (a > b || is_nan(a)) ? a : b;  // NaN wins, as on the other backends
    } else if (op == ReduceOp::kMin) {
      r = (a < b || is_nan(a)) ? a : b;
    } else if constexpr (std::is_integral_v<Math>) {
      using U = std::make_unsigned_t<Math>;  // wraps instead of overflowing
      r = static_cast<Math>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      r = a + b;
    }
    d[i] = static_cast<T>(r);
  }
}

void combine(void* dst, const void* src, int64_t n, DType dtype, ReduceOp op) {
  ember::detail::dispatch_all(dtype, "allreduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, bool>) {  // bytes; a sum of bools is "any"
      combine_typed<uint8_t>(dst, src, n, op == ReduceOp::kMin ? op : ReduceOp::kMax);
    } else {
      combine_typed<T>(dst, src, n, op);
    }
  });
}

struct P2p;

}  // namespace

// The TCP transport; the queue, threads, inline runs and timeouts are the scheduler's
// (detail/scheduler.h).
struct TcpProcessGroup::State final : detail::Transport {
  int rank = 0, size = 1, local_rank = 0;
  std::vector<int> global_ranks;  // the job's ranks of the members
  int global_rank = 0;
  ProcessGroupOptions options;
  // Where the group met: the store (none at size 1), its keys, and the greetings' group number.
  std::string master_addr;
  int master_port = 0;
  std::shared_ptr<TcpStore> store;
  std::string prefix;
  int32_t group_id = 0;
  std::vector<int> coll_fd, p2p_fd;  // by peer; -1 for this rank
  int wake_fd = -1;                  // eventfd: wakes the point-to-point thread
  std::unique_ptr<P2p> p2p;          // the point-to-point connections' state
  std::unique_ptr<detail::Scheduler> sched;

  ~State() override;
  // Writes `bye` to every peer's collective connection as the fingerprint of the collective it
  // would issue next, then ends its side of them: a rank waiting on this one reads it at once.
  void say_goodbye(const Fingerprint& bye);

  void wake() const {
    const uint64_t one = 1;
    if (wake_fd < 0) return;
    const ssize_t written = ::write(wake_fd, &one, sizeof(one));
    (void)written;  // a full counter already wakes the thread
  }
  const detail::GroupHealth& health() const { return sched->health(); }
  void break_group(const std::string& message) { sched->break_group(message); }

  // Bootstrap: the world group's store and keys, a subgroup's from its parent; then the mesh.
  void connect_mesh(const std::string& host, int port);
  void connect_subgroup(const State& parent, int64_t serial);
  void meet();

  std::shared_ptr<detail::ScheduledOp> make_op(OpKind kind) override;
  void start(detail::ScheduledOp& op) override;
  bool progress(detail::ScheduledOp& /*op*/) override { return true; }  // start() ran it
  void run_blocking(detail::ScheduledOp& op, std::chrono::milliseconds limit) override;
  void p2p_start(detail::ScheduledOp& op) override;
  void p2p_poll(bool idle) override;
  bool p2p_done(detail::ScheduledOp& op) override;
  bool p2p_polls_when_idle() const override { return true; }
  void wake_p2p() override { wake(); }
  void p2p_abandon() override;
  void request_peer_dumps() override {
    if (flight_dumps != nullptr) flight_dumps->request(kDumpWait);
  }
  // The dumps asked for and gathered over the store (the world group's, which its subgroups
  // share: they name ranks of the job); the send/recv thread answers every kDumpCheck.
  std::shared_ptr<detail::StoreFlightDumps> flight_dumps;
  Clock::time_point next_dump_check{};
  // Shuts the connections down, so peers blocked on this rank fail at once.
  void on_broken() override {
    for (const int fd : coll_fd)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    for (const int fd : p2p_fd)
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
  }
};

namespace {

using State = TcpProcessGroup::State;

struct Op final : detail::ScheduledOp {
  bool transferred = false;  // send/recv: its bytes went or came (the p2p thread's)
  using ScheduledOp::ScheduledOp;
  void recycle_transport() override { transferred = false; }
};

std::string peer_failure(const std::string& op, int rank, int peer, int error) {
  const std::string what = error == 0 ? "closed its connection (it exited or failed)"
                                      : std::string("is unreachable: ") + std::strerror(error);
  return op + " on rank " + std::to_string(rank) + ": rank " + std::to_string(peer) + " " + what +
         "; the group cannot be used any more";
}

// --- collectives: one op at a time on the collective connections ----------------------------

struct Ctx {
  State& s;
  const Op& op;
  int32_t kind;  // in the headers: the op's kind, or kFingerprintKind
  Clock::time_point deadline;
  std::chrono::milliseconds limit;  // what the timeout message names

  Header header(int32_t step, DType dtype, int64_t bytes) const {
    Header h;
    h.kind = kind;
    h.seq = op.seq;
    h.step = step;
    h.dtype = static_cast<int32_t>(dtype);
    h.bytes = bytes;
    return h;
  }
};

struct Out {
  int peer = -1;
  Header header;
  const char* data = nullptr;
  size_t done = 0;  // header and payload bytes written
  bool finished() const { return done == sizeof(Header) + static_cast<size_t>(header.bytes); }
};

struct In {
  int peer = -1;
  Header expect, got;
  char* data = nullptr;
  size_t done = 0;
  bool finished() const { return done == sizeof(Header) + static_cast<size_t>(expect.bytes); }
};

// Writes what the socket takes of header + payload; false when it would block.
bool write_some(int fd, const Header& header, const char* data, size_t& done, int& error) {
  const size_t total = sizeof(Header) + static_cast<size_t>(header.bytes);
  while (done < total) {
    iovec iov[2];
    int count = 0;
    if (done < sizeof(Header)) {
      iov[count++] = {const_cast<char*>(reinterpret_cast<const char*>(&header)) + done,
                      sizeof(Header) - done};
      if (header.bytes > 0)
        iov[count++] = {const_cast<char*>(data), static_cast<size_t>(header.bytes)};
    } else {
      iov[count++] = {const_cast<char*>(data) + (done - sizeof(Header)), total - done};
    }
    msghdr message{};
    message.msg_iov = iov;
    message.msg_iovlen = static_cast<size_t>(count);
    const ssize_t put = ::sendmsg(fd, &message, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
      error = errno == EPIPE || errno == ECONNRESET ? 0 : errno;
      return false;
    }
    done += static_cast<size_t>(put);
  }
  return true;
}

// Reads up to `n` bytes; returns the count, 0 when it would block, -1 when the peer is gone.
ssize_t read_some(int fd, char* data, size_t n, int& error) {
  for (;;) {
    const ssize_t got = ::recv(fd, data, n, 0);
    if (got > 0) return got;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    error = got == 0 || errno == ECONNRESET ? 0 : errno;
    return -1;
  }
}

// A fingerprint's number may differ (a goodbye's): check_fingerprints names that.
void check_header(const Ctx& c, int peer, const Header& got, const Header& expect) {
  EMBER_CHECK(got.magic == expect.magic && got.kind == expect.kind &&
                  (got.seq == expect.seq || expect.kind == kFingerprintKind) &&
                  got.step == expect.step && got.dtype == expect.dtype && got.bytes == expect.bytes,
              c.op.name(), "rank ", c.s.rank, " expected ", describe(expect), " from rank ", peer,
              " but received ", describe(got),
              "; every rank must issue the same collectives, in the same order, with the same "
              "shapes and dtypes");
}

// Moves `out` and `in` (either may be null) at once, polling until both are done.
void transfer(const Ctx& c, Out* out, In* in) {
  State& s = c.s;
  const auto spin_until = Clock::now() + kSpin;
  for (;;) {
    int error = -1;
    if (out != nullptr && !out->finished()) {
      write_some(s.coll_fd[static_cast<size_t>(out->peer)], out->header, out->data, out->done,
                 error);
      if (error >= 0 && c.kind == kFingerprintKind) {
        // A peer that left may have said goodbye first: reading from it tells.
        out->done = sizeof(Header) + static_cast<size_t>(out->header.bytes);
      } else if (error >= 0) {
        throw Error(peer_failure(c.op.name(), s.rank, out->peer, error));
      }
    }
    while (in != nullptr && !in->finished()) {
      const int fd = s.coll_fd[static_cast<size_t>(in->peer)];
      const bool header = in->done < sizeof(Header);
      char* target = header ? reinterpret_cast<char*>(&in->got) + in->done
                            : in->data + (in->done - sizeof(Header));
      const size_t want = header
                              ? sizeof(Header) - in->done
                              : static_cast<size_t>(in->expect.bytes) - (in->done - sizeof(Header));
      const ssize_t got = read_some(fd, target, want, error);
      if (got < 0) throw Error(peer_failure(c.op.name(), s.rank, in->peer, error));
      if (got == 0) break;
      in->done += static_cast<size_t>(got);
      if (header && in->done == sizeof(Header)) check_header(c, in->peer, in->got, in->expect);
    }
    const bool out_done = out == nullptr || out->finished();
    const bool in_done = in == nullptr || in->finished();
    if (out_done && in_done) return;
    if (s.health().broken()) throw Error(s.health().reason());
    if (Clock::now() >= c.deadline) {
      throw Error(s.health().timeout_message(c.op.name(), c.limit));
    }
    pollfd fds[2];
    nfds_t count = 0;
    if (!out_done) fds[count++] = {s.coll_fd[static_cast<size_t>(out->peer)], POLLOUT, 0};
    if (!in_done) {
      const int fd = s.coll_fd[static_cast<size_t>(in->peer)];
      if (count == 1 && fds[0].fd == fd) {
        fds[0].events |= POLLIN;
      } else {
        fds[count++] = {fd, POLLIN, 0};
      }
    }
    // A peer that answers within kSpin is met without the wake-up a sleeping poll costs.
    const bool spin = Clock::now() < spin_until;
    if (spin) std::this_thread::yield();
    ::poll(fds, count, spin ? 0 : remaining_ms(c.deadline));
  }
}

struct Region {
  char* data = nullptr;
  int64_t count = 0;  // elements
};

// Sends `out` to rank `to` while receiving `in` from rank `from` (-1: no such side), chunk
// by chunk in lockstep. With `op`, received chunks are combined into `in`, else stored.
void stream(const Ctx& c, int32_t step, DType dtype, int to, Region out, int from, Region in,
            const ReduceOp* op) {
  const auto es = static_cast<int64_t>(element_size(dtype));
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / es);
  auto chunks = [&](int64_t count) { return std::max<int64_t>(1, (count + chunk - 1) / chunk); };
  const int64_t n_out = to >= 0 ? chunks(out.count) : 0;
  const int64_t n_in = from >= 0 ? chunks(in.count) : 0;
  std::vector<char> scratch(
      op != nullptr && from >= 0 ? static_cast<size_t>(std::min(in.count, chunk) * es) : 0);
  for (int64_t k = 0; k < std::max(n_out, n_in); ++k) {
    const int64_t begin = k * chunk;
    Out o;
    In i;
    int64_t in_count = 0;
    if (k < n_out) {
      const int64_t count = std::clamp<int64_t>(out.count - begin, 0, chunk);
      o.peer = to;
      o.header = c.header(step, dtype, count * es);
      o.data = out.data + begin * es;
    }
    if (k < n_in) {
      in_count = std::clamp<int64_t>(in.count - begin, 0, chunk);
      i.peer = from;
      i.expect = c.header(step, dtype, in_count * es);
      i.data = op != nullptr ? scratch.data() : in.data + begin * es;
    }
    transfer(c, k < n_out ? &o : nullptr, k < n_in ? &i : nullptr);
    if (k < n_in && op != nullptr)
      combine(in.data + begin * es, scratch.data(), in_count, dtype, *op);
  }
}

int ring_index(int i, int size) { return ((i % size) + size) % size; }

// Ring reduce-scatter: after size - 1 steps rank r holds regions[r] reduced over all ranks.
void ring_reduce_scatter(const Ctx& c, const std::vector<Region>& regions, DType dtype,
                         ReduceOp op) {
  const int r = c.s.rank, n = c.s.size;
  const ReduceOp combine_op = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  for (int step = 0; step < n - 1; ++step) {
    stream(c, step, dtype, ring_index(r + 1, n),
           regions[static_cast<size_t>(ring_index(r - step - 1, n))], ring_index(r - 1, n),
           regions[static_cast<size_t>(ring_index(r - step - 2, n))], &combine_op);
  }
}

// Ring allgather: rank r starts with regions[r] and ends with every region.
void ring_allgather(const Ctx& c, const std::vector<Region>& regions, DType dtype,
                    int32_t first_step) {
  const int r = c.s.rank, n = c.s.size;
  for (int step = 0; step < n - 1; ++step) {
    stream(c, first_step + step, dtype, ring_index(r + 1, n),
           regions[static_cast<size_t>(ring_index(r - step, n))], ring_index(r - 1, n),
           regions[static_cast<size_t>(ring_index(r - step - 1, n))], nullptr);
  }
}

void ring_allreduce(const Ctx& c, char* data, int64_t numel, DType dtype, ReduceOp op) {
  const int n = c.s.size;
  const auto es = static_cast<int64_t>(element_size(dtype));
  std::vector<Region> regions;
  for (int i = 0; i < n; ++i) {
    const int64_t begin = numel * i / n, end = numel * (i + 1) / n;
    regions.push_back({data + begin * es, end - begin});
  }
  ring_reduce_scatter(c, regions, dtype, op);
  const Region& own = regions[static_cast<size_t>(c.s.rank)];
  if (op == ReduceOp::kAvg) detail::divide_in_place(own.data, own.count, dtype, n);
  ring_allgather(c, regions, dtype, n - 1);
}

Region whole(const Tensor& t) { return {static_cast<char*>(t.data_ptr()), t.numel()}; }

// The header of the fingerprint a rank sends `to` ahead of a collective, or as its goodbye.
Header fingerprint_header(const State& s, int to, int64_t seq) {
  Header h;
  h.kind = kFingerprintKind;
  h.seq = seq;
  h.step = ring_index(to - s.rank, s.size);
  h.dtype = static_cast<int32_t>(kU8);
  h.bytes = sizeof(Fingerprint);
  return h;
}

// Every rank sends its fingerprint straight to every other (step d: to rank + d, from
// rank - d), so a peer that left and said goodbye is heard by every rank, then checks them.
void exchange_fingerprints(const Ctx& c) {
  State& s = c.s;
  std::vector<Fingerprint> all(static_cast<size_t>(s.size));
  all[static_cast<size_t>(s.rank)] = c.op.fingerprint;
  for (int d = 1; d < s.size; ++d) {
    Out o;
    o.peer = ring_index(s.rank + d, s.size);
    o.header = fingerprint_header(s, o.peer, c.op.seq);
    o.data = reinterpret_cast<const char*>(&c.op.fingerprint);
    In i;
    i.peer = ring_index(s.rank - d, s.size);
    i.expect = o.header;
    i.data = reinterpret_cast<char*>(&all[static_cast<size_t>(i.peer)]);
    transfer(c, &o, &i);
  }
  detail::check_fingerprints(c.op.name(), all, s.rank);
}

void run_collective(State& s, Op& op, std::chrono::milliseconds limit) {
  const auto deadline = op.started + limit;
  if (s.size > 1) exchange_fingerprints({s, op, kFingerprintKind, deadline, limit});
  const Ctx c{s, op, static_cast<int32_t>(op.kind), deadline, limit};
  const DType dtype = op.tensor.defined() ? op.tensor.dtype() : kI32;
  const bool avg = op.reduce == ReduceOp::kAvg;
  switch (op.kind) {
    case OpKind::kAllreduce:
      ring_allreduce(c, static_cast<char*>(op.tensor.data_ptr()), op.tensor.numel(), dtype,
                     op.reduce);
      break;
    case OpKind::kBarrier: {
      int32_t token = 0;
      ring_allreduce(c, reinterpret_cast<char*>(&token), 1, kI32, ReduceOp::kSum);
      break;
    }
    case OpKind::kBroadcast:
      if (s.rank == op.peer) {
        for (int p = 0; p < s.size; ++p)
          if (p != s.rank) stream(c, 0, dtype, p, whole(op.tensor), -1, {}, nullptr);
      } else {
        stream(c, 0, dtype, -1, {}, op.peer, whole(op.tensor), nullptr);
      }
      break;
    case OpKind::kReduce:
      if (s.rank == op.peer) {
        const ReduceOp combine_op = avg ? ReduceOp::kSum : op.reduce;
        for (int p = 0; p < s.size; ++p)
          if (p != s.rank) stream(c, 0, dtype, -1, {}, p, whole(op.tensor), &combine_op);
        if (avg) detail::divide_in_place(op.tensor.data_ptr(), op.tensor.numel(), dtype, s.size);
      } else {
        stream(c, 0, dtype, op.peer, whole(op.tensor), -1, {}, nullptr);
      }
      break;
    case OpKind::kAllgather: {
      std::vector<Region> regions;
      for (const Tensor& t : op.list) regions.push_back(whole(t));
      void* own = op.list[static_cast<size_t>(s.rank)].data_ptr();
      if (own != op.tensor.data_ptr()) std::memcpy(own, op.tensor.data_ptr(), op.tensor.nbytes());
      ring_allgather(c, regions, dtype, 0);
      break;
    }
    case OpKind::kReduceScatter: {
      // The inputs stay as they are: the ring works on a packed copy.
      const size_t bytes = op.tensor.nbytes();
      std::vector<char> packed(bytes * static_cast<size_t>(s.size));
      std::vector<Region> regions;
      for (int r = 0; r < s.size; ++r) {
        char* slot = packed.data() + bytes * static_cast<size_t>(r);
        std::memcpy(slot, op.list[static_cast<size_t>(r)].data_ptr(), bytes);
        regions.push_back({slot, op.tensor.numel()});
      }
      ring_reduce_scatter(c, regions, dtype, op.reduce);
      std::memcpy(op.tensor.data_ptr(), regions[static_cast<size_t>(s.rank)].data, bytes);
      if (avg) detail::divide_in_place(op.tensor.data_ptr(), op.tensor.numel(), dtype, s.size);
      break;
    }
    case OpKind::kSend:
    case OpKind::kRecv:
      EMBER_ASSERT(false, "run_collective: ", op.name(), " is not a collective");
  }
}

}  // namespace

std::shared_ptr<detail::ScheduledOp> TcpProcessGroup::State::make_op(OpKind kind) {
  return std::make_shared<Op>(sched->shared_self(), kind);
}

void TcpProcessGroup::State::start(detail::ScheduledOp& op) {
  run_collective(*this, static_cast<Op&>(op), options.timeout);
}

void TcpProcessGroup::State::run_blocking(detail::ScheduledOp& op,
                                          std::chrono::milliseconds limit) {
  op.started = Clock::now();
  run_collective(*this, static_cast<Op&>(op), limit);
}

// --- point-to-point: every started send and recv at once, on the point-to-point connections --

namespace {

// A message that arrived before its recv was posted.
struct Unexpected {
  Header header;
  std::vector<char> data;
  bool complete = false;
  std::shared_ptr<Op> claimed;  // the recv that takes it once complete
};

struct Peer {
  int fd = -1;
  bool closed = false;
  std::deque<std::shared_ptr<Op>> sends;  // in issue order; the front one is being written
  Header out_header;
  bool out_started = false;
  size_t out_done = 0;
  int64_t out_seq = 0, in_seq = 0;
  std::deque<std::shared_ptr<Op>> recvs;  // posted, no message yet, in posting order
  std::list<Unexpected> unexpected;       // in arrival order
  // The message coming in: its header, then its payload into a recv or an Unexpected.
  Header in_header;
  size_t in_header_done = 0;
  bool in_payload = false;
  std::shared_ptr<Op> in_recv;
  Unexpected* in_buffer = nullptr;
  size_t in_payload_done = 0;

  // The first op waiting on this peer, for error messages; null when none.
  const Op* pending() const {
    if (in_recv) return in_recv.get();
    if (!recvs.empty()) return recvs.front().get();
    if (!sends.empty()) return sends.front().get();
    for (const auto& u : unexpected)
      if (u.claimed) return u.claimed.get();
    return nullptr;
  }
};

void check_match(const State& s, const Op& recv, int peer, const Header& h) {
  EMBER_CHECK(h.bytes == static_cast<int64_t>(recv.tensor.nbytes()) &&
                  h.dtype == static_cast<int32_t>(recv.tensor.dtype()),
              recv.name(), "rank ", s.rank, " receives ", recv.tensor.dtype(), " ",
              shape_str(recv.tensor.sizes()), " (", recv.tensor.nbytes(), " bytes) with tag ",
              recv.tag, " but rank ", peer, " sent ", describe(h));
}

struct P2p {
  State& s;
  std::vector<Peer> peers;

  // The scheduler completes it (State::p2p_done).
  static void finish(const std::shared_ptr<Op>& op) { op->transferred = true; }

  // After a break: the scheduler failed every started op.
  void abandon() {
    for (Peer& p : peers) {
      p.sends.clear();
      p.recvs.clear();
      p.unexpected.clear();
      p.in_recv.reset();
      p.in_buffer = nullptr;
      p.in_payload = false;
      p.in_header_done = 0;
      p.out_started = false;
      p.out_done = 0;
    }
  }

  void start(const std::shared_ptr<Op>& op) {
    Peer& p = peers[static_cast<size_t>(op->peer)];
    if (op->kind == OpKind::kSend) {
      if (p.closed) throw Error(peer_failure(op->name(), s.rank, op->peer, 0));
      p.sends.push_back(op);
      return;
    }
    // A peer that has gone may have sent this message before it left.
    for (auto it = p.unexpected.begin(); it != p.unexpected.end(); ++it) {
      if (it->claimed || it->header.step != op->tag) continue;
      check_match(s, *op, op->peer, it->header);
      if (!it->complete) {
        it->claimed = op;
        return;
      }
      std::memcpy(op->tensor.data_ptr(), it->data.data(), it->data.size());
      p.unexpected.erase(it);
      finish(op);
      return;
    }
    if (p.closed) throw Error(peer_failure(op->name(), s.rank, op->peer, 0));
    p.recvs.push_back(op);
  }

  void write(Peer& p, int peer) {
    while (!p.sends.empty()) {
      const std::shared_ptr<Op> op = p.sends.front();
      if (!p.out_started) {
        p.out_header = Header{};
        p.out_header.kind = static_cast<int32_t>(OpKind::kSend);
        p.out_header.seq = ++p.out_seq;
        p.out_header.step = op->tag;
        p.out_header.dtype = static_cast<int32_t>(op->tensor.dtype());
        p.out_header.bytes = static_cast<int64_t>(op->tensor.nbytes());
        p.out_started = true;
        p.out_done = 0;
      }
      int error = -1;
      const bool done = write_some(
          p.fd, p.out_header, static_cast<const char*>(op->tensor.data_ptr()), p.out_done, error);
      if (error >= 0) throw Error(peer_failure(op->name(), s.rank, peer, error));
      if (!done) return;
      p.sends.pop_front();
      p.out_started = false;
      finish(op);
    }
  }

  // A message header from `peer` is complete: find its recv or buffer it.
  void route(Peer& p, int peer) {
    const Header& h = p.in_header;
    EMBER_CHECK(h.magic == kMagic && h.kind == static_cast<int32_t>(OpKind::kSend) &&
                    h.seq == p.in_seq + 1 && h.bytes >= 0,
                "recv", "rank ", s.rank, " expected send #", p.in_seq + 1, " from rank ", peer,
                " but received ", describe(h), "; the point-to-point connection is out of step");
    ++p.in_seq;
    p.in_payload = true;
    p.in_payload_done = 0;
    for (auto it = p.recvs.begin(); it != p.recvs.end(); ++it) {
      if ((*it)->tag != h.step) continue;
      check_match(s, **it, peer, h);
      p.in_recv = *it;
      p.recvs.erase(it);
      return;
    }
    p.unexpected.push_back({h, std::vector<char>(static_cast<size_t>(h.bytes)), false, nullptr});
    p.in_buffer = &p.unexpected.back();
  }

  void landed(Peer& p) {
    p.in_payload = false;
    p.in_header_done = 0;
    if (p.in_recv) {
      finish(p.in_recv);
      p.in_recv.reset();
      return;
    }
    Unexpected* u = std::exchange(p.in_buffer, nullptr);
    u->complete = true;
    if (!u->claimed) return;
    const std::shared_ptr<Op> op = u->claimed;
    std::memcpy(op->tensor.data_ptr(), u->data.data(), u->data.size());
    p.unexpected.remove_if([u](const Unexpected& x) { return &x == u; });
    finish(op);
  }

  void read(Peer& p, int peer) {
    for (;;) {
      int error = -1;
      ssize_t got = 0;
      if (!p.in_payload) {
        got = read_some(p.fd, reinterpret_cast<char*>(&p.in_header) + p.in_header_done,
                        sizeof(Header) - p.in_header_done, error);
        if (got > 0) {
          p.in_header_done += static_cast<size_t>(got);
          if (p.in_header_done == sizeof(Header)) route(p, peer);
        }
      } else {
        char* target =
            p.in_recv ? static_cast<char*>(p.in_recv->tensor.data_ptr()) : p.in_buffer->data.data();
        const size_t total = static_cast<size_t>(p.in_header.bytes);
        if (p.in_payload_done < total) {
          got = read_some(p.fd, target + p.in_payload_done, total - p.in_payload_done, error);
          if (got > 0) p.in_payload_done += static_cast<size_t>(got);
        }
      }
      if (p.in_payload && p.in_payload_done == static_cast<size_t>(p.in_header.bytes)) {
        landed(p);
        continue;
      }
      if (got < 0) {
        // A peer that exits with nothing outstanding is no failure; one that leaves a message
        // half sent or an operation waiting is.
        const Op* waiting = p.pending();
        if (waiting == nullptr && !p.in_payload && p.in_header_done == 0) {
          p.closed = true;
          return;
        }
        throw Error(
            peer_failure(waiting != nullptr ? waiting->name() : "recv", s.rank, peer, error));
      }
      if (got == 0) return;
    }
  }

  // Waits (up to kPollSlice, or until State::wake) for the connections, and moves what
  // they are ready for.
  void poll() {
    std::vector<pollfd> fds{{s.wake_fd, POLLIN, 0}};
    if (!s.health().broken()) {
      for (const Peer& p : peers) {
        if (p.fd < 0 || p.closed) continue;
        fds.push_back({p.fd, static_cast<short>(POLLIN | (p.sends.empty() ? 0 : POLLOUT)), 0});
      }
    }
    ::poll(fds.data(), fds.size(), static_cast<int>(kPollSlice.count()));
    uint64_t count = 0;
    if (fds[0].revents != 0) {
      const ssize_t drained = ::read(s.wake_fd, &count, sizeof(count));
      (void)drained;
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const auto peer =
          static_cast<int>(std::find_if(peers.begin(), peers.end(),
                                        [&](const Peer& p) { return p.fd == fds[i].fd; }) -
                           peers.begin());
      Peer& p = peers[static_cast<size_t>(peer)];
      write(p, peer);
      read(p, peer);
    }
  }
};

}  // namespace

TcpProcessGroup::State::~State() {
  for (const int fd : coll_fd)
    if (fd >= 0) ::close(fd);
  for (const int fd : p2p_fd)
    if (fd >= 0) ::close(fd);
  if (wake_fd >= 0) ::close(wake_fd);
}

void TcpProcessGroup::State::say_goodbye(const Fingerprint& bye) {
  for (int peer = 0; peer < size; ++peer) {
    const int fd = coll_fd[static_cast<size_t>(peer)];
    if (fd < 0) continue;
    const Header h = fingerprint_header(*this, peer, bye.seq);
    size_t done = 0;
    int error = -1;
    // Best effort, without waiting: 128 bytes fit any socket's buffer between collectives.
    write_some(fd, h, reinterpret_cast<const char*>(&bye), done, error);
    ::shutdown(fd, SHUT_WR);
    // Unread bytes make close() reset the connection, which may discard the goodbye unread.
    char sink[4096];
    while (::recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0) {
    }
  }
}

void TcpProcessGroup::State::p2p_start(detail::ScheduledOp& op) {
  p2p->start(std::static_pointer_cast<Op>(op.shared_from_this()));
}

void TcpProcessGroup::State::p2p_poll(bool /*idle*/) {
  p2p->poll();
  if (flight_dumps != nullptr && flight_recorder_enabled() && Clock::now() >= next_dump_check) {
    next_dump_check = Clock::now() + kDumpCheck;
    // The store is gone (rank 0 ended): nobody can ask any more.
    if (!flight_dumps->answer(kDumpWait)) next_dump_check += std::chrono::hours(24 * 365);
  }
}

bool TcpProcessGroup::State::p2p_done(detail::ScheduledOp& op) {
  return static_cast<Op&>(op).transferred;
}

void TcpProcessGroup::State::p2p_abandon() { p2p->abandon(); }

// --- bootstrap ------------------------------------------------------------------------------

void TcpProcessGroup::State::connect_mesh(const std::string& host, int port) {
  if (size > 1) {
    EMBER_CHECK(!host.empty() && port > 0 && port <= 65535, "TcpProcessGroup",
                "MASTER_ADDR and MASTER_PORT must name rank 0's address and a TCP port, got \"",
                host, "\" and ", port);
    master_addr = host;
    master_port = port;
    store = detail::shared_store(host, port, size, rank, options.timeout);
    // The n-th group of every rank meets under the same keys.
    const int64_t group = store->add("ember/tcp/groups/" + std::to_string(rank), 1);
    prefix = "ember/tcp/" + std::to_string(group) + "/";
    group_id = static_cast<int32_t>(group);
    flight_dumps = std::make_shared<detail::StoreFlightDumps>(
        store, prefix + "flight/", rank, size,
        "a peer of the tcp group on rank " + std::to_string(rank) +
            " asked, its group having broken");
  }
  meet();
}

// A subgroup meets under its parent's keys and its number among the parent's subgroups,
// which every rank of the parent counts alike, members or not (see ProcessGroup::new_group);
// its greetings carry a number made from those keys, far above the world groups' counts.
void TcpProcessGroup::State::connect_subgroup(const State& parent, int64_t serial) {
  master_addr = parent.master_addr;
  master_port = parent.master_port;
  store = parent.store;
  flight_dumps = parent.flight_dumps;
  prefix = parent.prefix + "sub" + std::to_string(serial) + "/";
  uint32_t hash = 2166136261u;  // FNV-1a
  for (const char c : prefix) hash = (hash ^ static_cast<uint8_t>(c)) * 16777619u;
  group_id = static_cast<int32_t>((hash & 0x3fffffffu) | 0x40000000u);
  meet();
}

// Every member publishes its listener under `prefix` and connects the mesh.
void TcpProcessGroup::State::meet() {
  coll_fd.assign(static_cast<size_t>(size), -1);
  p2p_fd.assign(static_cast<size_t>(size), -1);
  wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  EMBER_CHECK(wake_fd >= 0, "TcpProcessGroup", "eventfd failed: ", std::strerror(errno));
  if (size == 1) return;
  const auto deadline = Clock::now() + options.timeout;
  const std::string& secret = detail::job_secret();
  const int32_t group = group_id;
  const std::string address = local_address_towards(master_addr, master_port);
  int listen_port = 0;
  FdGuard listener{listen_on(address, listen_port)};
  store->set(prefix + std::to_string(rank), address + " " + std::to_string(listen_port));

  auto slot = [&](int32_t channel, int peer) -> int& {
    return (channel == kCollectives ? coll_fd : p2p_fd)[static_cast<size_t>(peer)];
  };
  // Lower ranks listen, higher ranks connect.
  for (int peer = 0; peer < rank; ++peer) {
    const std::string where = store->get(prefix + std::to_string(peer));
    const auto space = where.find(' ');
    const std::string peer_address = where.substr(0, space);
    const int peer_port = std::stoi(where.substr(space + 1));
    for (const int32_t channel : {kCollectives, kPointToPoint}) {
      int& fd = slot(channel, peer);
      fd = connect_to(peer_address, peer_port, peer, deadline);
      const Hello hello{kMagic, static_cast<int32_t>(group), rank, channel};
      const std::string refused = detail::connect_handshake(
          fd, secret, kMeshContext, std::min(deadline, Clock::now() + kGreetingLimit),
          std::string(reinterpret_cast<const char*>(&hello), sizeof(hello)));
      EMBER_CHECK(refused.empty(), "TcpProcessGroup", "rank ", peer, " at ", peer_address, ":",
                  peer_port, " ", refused);
    }
  }
  // Strangers that reach the listener (a port scan, a wrong greeting, a wrong secret) are
  // dropped and logged; the listener keeps waiting for the ranks it expects.
  const std::string who =
      "TcpProcessGroup rank " + std::to_string(rank) + " (group " + std::to_string(group) + ")";
  for (int pending = 2 * (size - 1 - rank); pending > 0;) {
    EMBER_CHECK(detail::wait_readable(listener.fd, deadline), "TcpProcessGroup", "rank ", rank,
                " waited ", options.timeout.count(), " ms for ", pending,
                " connections from higher ranks; did every rank start?");
    FdGuard accepted{::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC)};
    if (accepted.fd < 0) continue;  // interrupted or aborted by the peer: wait again
    const auto greeting_deadline = std::min(deadline, Clock::now() + kGreetingLimit);
    std::string failure =
        detail::accept_handshake(accepted.fd, secret, kMeshContext, greeting_deadline);
    Hello hello;
    if (failure.empty() &&
        !detail::read_by(accepted.fd, &hello, sizeof(hello), greeting_deadline)) {
      failure = errno == ETIMEDOUT ? "sent no greeting in time" : "closed before its greeting";
    }
    if (failure.empty() &&
        !(hello.magic == kMagic && hello.group == group && hello.rank > rank && hello.rank < size &&
          (hello.channel == kCollectives || hello.channel == kPointToPoint) &&
          slot(hello.channel, hello.rank) < 0)) {
      failure = "sent an unexpected greeting (magic " + std::to_string(hello.magic) + ", group " +
                std::to_string(hello.group) + ", rank " + std::to_string(hello.rank) +
                ", channel " + std::to_string(hello.channel) + ")";
    }
    if (!failure.empty()) {
      detail::log_dropped(who, "dropped a connection from " + detail::peer_address(accepted.fd) +
                                   ": it " + failure);
      continue;
    }
    slot(hello.channel, hello.rank) = std::exchange(accepted.fd, -1);
    --pending;
  }
  const int one = 1;
  for (int peer = 0; peer < size; ++peer) {
    for (const int32_t channel : {kCollectives, kPointToPoint}) {
      const int fd = slot(channel, peer);
      if (fd < 0) continue;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
  }
}

namespace {

std::shared_ptr<State> make_state(int rank, int size, int local_rank,
                                  const ProcessGroupOptions& options) {
  EMBER_CHECK(size >= 1 && rank >= 0 && rank < size, "TcpProcessGroup", "rank ", rank,
              " is not in a group of ", size);
  auto s = std::make_shared<State>();
  s->rank = rank;
  s->size = size;
  s->local_rank = local_rank;
  s->options = options;
  s->options.timeout = detail::checked_timeout("TcpProcessGroup", options.timeout);
  return s;
}

std::shared_ptr<State> make_world_state(const std::string& master_addr, int master_port, int rank,
                                        int size, int local_rank,
                                        const ProcessGroupOptions& options) {
  auto s = make_state(rank, size, local_rank, options);
  for (int r = 0; r < size; ++r) s->global_ranks.push_back(r);
  s->global_rank = rank;
  s->connect_mesh(master_addr, master_port);
  return s;
}

}  // namespace

TcpProcessGroup::TcpProcessGroup(const std::string& master_addr, int master_port, int rank,
                                 int size, int local_rank, ProcessGroupOptions options)
    : TcpProcessGroup(make_world_state(master_addr, master_port, rank, size, local_rank, options)) {
}

TcpProcessGroup::TcpProcessGroup(std::shared_ptr<State> state)
    : BackendGroup(state->rank, state->local_rank, state->global_ranks, state->global_rank),
      state_(std::move(state)) {
  State& s = *state_;
  s.p2p = std::make_unique<P2p>(P2p{s, std::vector<Peer>(static_cast<size_t>(s.size))});
  for (int p = 0; p < s.size; ++p)
    s.p2p->peers[static_cast<size_t>(p)].fd = s.p2p_fd[static_cast<size_t>(p)];
  s.sched = std::make_unique<detail::Scheduler>(s, "tcp", s.rank, s.global_ranks, s.global_rank,
                                                s.options);
  s.sched->start_threads(std::shared_ptr<detail::Scheduler>(state_, s.sched.get()));
}

std::shared_ptr<ProcessGroup> TcpProcessGroup::make_subgroup(const SubgroupSpec& spec) {
  if (spec.rank < 0) return nullptr;  // only the members meet
  const State& parent = *state_;
  auto s = make_state(spec.rank, static_cast<int>(spec.ranks.size()), parent.local_rank,
                      spec.options.value_or(parent.options));
  s->global_ranks = spec.global_ranks;
  s->global_rank = parent.global_rank;
  s->connect_subgroup(parent, spec.serial);
  return std::shared_ptr<TcpProcessGroup>(new TcpProcessGroup(std::move(s)));
}

TcpProcessGroup::~TcpProcessGroup() {
  state_->sched->stop_and_wait();
  state_->sched->join();
  if (!state_->health().broken()) state_->say_goodbye(state_->sched->goodbye());
}

namespace {

void check_cpu(const char* op, const Tensor& t) {
  EMBER_CHECK(t.is_cpu(), op, "the tcp backend moves CPU tensors only, got one on ", t.device(),
              " (CUDA tensors go over the nccl backend)");
}

}  // namespace

void TcpProcessGroup::check_devices(const CollectiveRequest& request) const {
  if (request.tensor != nullptr) check_cpu(request.name(), *request.tensor);
}

WorkHandle TcpProcessGroup::submit(const CollectiveRequest& request) {
  return state_->sched->enqueue(request);
}

}  // namespace ember::dist

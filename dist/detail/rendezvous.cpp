#include "rendezvous.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <thread>

#include <ember/tensor/error.h>

#include "shared_store.h"
#include "supervisor.h"

namespace ember::dist::detail {

namespace {

constexpr const char* kOp = "init_process_group";

int parse_port(const std::string& url, const std::string& text) {
  int port = 0;
  bool digits = !text.empty() && text.size() <= 5;
  for (char c : text) digits = digits && c >= '0' && c <= '9';
  if (digits) port = std::stoi(text);
  EMBER_CHECK(digits && port >= 1 && port <= 65535, kOp, "init_method \"", url, "\": port \"", text,
              "\" is not a TCP port (1 to 65535)");
  return port;
}

// The rendezvous file's fields: "ember-rendezvous 1", then "key value" lines.
struct FileRecord {
  int world_size = 0;
  std::string nonce, host, writer;
  int port = 0;
};

std::string describe(const FileRecord& r) {
  return "world size " + std::to_string(r.world_size) + ", store " + r.host + ":" +
         std::to_string(r.port) + ", nonce " + r.nonce + ", written by " + r.writer;
}

// Nullopt-like: false when the file does not exist. ember::Error when it is not ours.
bool read_record(const std::string& path, FileRecord& out) {
  std::ifstream in(path);
  if (!in) return false;
  std::string magic, version;
  in >> magic >> version;
  EMBER_CHECK(magic == "ember-rendezvous" && version == "1", kOp, "file://", path,
              " is not an ember rendezvous file; give init_method a path of its own");
  std::string key;
  while (in >> key) {
    if (key == "world_size")
      in >> out.world_size;
    else if (key == "nonce")
      in >> out.nonce;
    else if (key == "host")
      in >> out.host;
    else if (key == "port")
      in >> out.port;
    else if (key == "writer")
      std::getline(in >> std::ws, out.writer);
  }
  EMBER_CHECK(out.world_size >= 1 && !out.nonce.empty() && !out.host.empty() && out.port > 0, kOp,
              "file://", path, " is an incomplete ember rendezvous file");
  return true;
}

std::string fresh_nonce() {
  std::random_device device;
  std::ostringstream out;
  out << std::hex;
  for (int i = 0; i < 4; ++i) out << device();
  return out.str();
}

std::string this_host() {
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && addr[0] != '\0') {
    return addr;
  }
  char name[256] = {};
  EMBER_CHECK(::gethostname(name, sizeof(name) - 1) == 0, kOp,
              "gethostname failed: ", std::strerror(errno));
  return name;
}

// Rank 0 publishes `record` at `path` atomically (a whole file or none), refusing one that is
// already there.
void publish(const std::string& path, const FileRecord& record) {
  const std::string tmp = path + ".tmp." + record.nonce;
  {
    std::ofstream out(tmp, std::ios::trunc);
    EMBER_CHECK(out.good(), kOp, "cannot write the rendezvous file ", tmp, ": ",
                std::strerror(errno));
    out << "ember-rendezvous 1\nworld_size " << record.world_size << "\nnonce " << record.nonce
        << "\nhost " << record.host << "\nport " << record.port << "\nwriter " << record.writer
        << "\n";
    out.flush();
    EMBER_CHECK(out.good(), kOp, "cannot write the rendezvous file ", tmp);
  }
  const int linked = ::link(tmp.c_str(), path.c_str());
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (linked == 0) return;
  EMBER_CHECK(link_errno == EEXIST, kOp, "cannot create the rendezvous file ", path, ": ",
              std::strerror(link_errno));
  FileRecord old;
  std::string what = "an unreadable file";
  try {
    if (read_record(path, old)) what = "a rendezvous file (" + describe(old) + ")";
  } catch (const Error& e) {
    what = e.what();
  }
  throw Error(std::string(kOp) + ": file://" + path + " already exists: " + what +
              ". ember removes the file once every rank has joined, so one found at the start "
              "is stale, left by an earlier run that died while starting; it is not reused. "
              "Delete it (or use a fresh path) and start again");
}

// Meets every rank at `store` under a numbered round: rank 0's world size is the job's; each
// other rank reports whether it agrees, and rank 0 waits for all of them.
void meet(TcpStore& store, const std::string& where, const LaunchEnv& self,
          std::chrono::milliseconds timeout) {
  const std::string round =
      "ember/init/" +
      std::to_string(store.add("ember/init/rounds/" + std::to_string(self.rank), 1));
  const int64_t seen = store.add(round + "/rank/" + std::to_string(self.rank), 1);
  EMBER_CHECK(seen == 1, kOp, "rank ", self.rank, " joined ", where,
              " twice: two processes were given the same rank (world_size=", self.world_size, ")");
  if (self.rank == 0) {
    store.set(round + "/world_size", std::to_string(self.world_size));
    for (int r = 1; r < self.world_size; ++r) {
      std::string status;
      try {
        status = store.get(round + "/joined/" + std::to_string(r));
      } catch (const Error& e) {
        throw Error(std::string(kOp) + ": rank " + std::to_string(r) + " did not join " + where +
                    " within " + std::to_string(timeout.count()) + " ms (rank 0 has world_size=" +
                    std::to_string(self.world_size) + "): " + e.what());
      }
      EMBER_CHECK(status == "ok", kOp, "rank ", r, " refused to join ", where, ": ", status);
    }
    return;
  }
  const std::string theirs = store.get(round + "/world_size");
  const std::string mine = std::to_string(self.world_size);
  if (theirs != mine) {
    const std::string message = "world size mismatch at " + where +
                                ": rank 0 has world_size=" + theirs + ", rank " +
                                std::to_string(self.rank) + " has world_size=" + mine;
    store.set(round + "/joined/" + std::to_string(self.rank), message);
    throw Error(std::string(kOp) + ": " + message);
  }
  store.set(round + "/joined/" + std::to_string(self.rank), "ok");
}

StoreAddress file_rendezvous(const InitMethod& method, const LaunchEnv& self,
                             std::chrono::milliseconds timeout) {
  const std::string& path = method.path;
  if (self.rank == 0) {
    FileRecord record;
    record.world_size = self.world_size;
    record.nonce = fresh_nonce();
    record.host = this_host();
    record.writer = "pid " + std::to_string(::getpid()) + " at unix time " +
                    std::to_string(static_cast<long long>(std::time(nullptr)));
    auto store = serve_shared_store(record.host, self.world_size, timeout);
    record.port = store->port();
    try {
      store->set("ember/init/file/nonce", record.nonce);
      publish(path, record);
    } catch (...) {
      forget_shared_store(record.host, record.port);  // a stale file: nobody meets here
      throw;
    }
    // The file goes once every rank has joined, or when the meeting fails: a file found at
    // the start of a run is then always a stale one.
    struct Remove {
      std::string path;
      ~Remove() { ::unlink(path.c_str()); }
    } remove{path};
    try {
      meet(*store, method.url, self, timeout);
    } catch (...) {
      forget_shared_store(record.host, record.port);  // no rank will use this store
      throw;
    }
    return {record.host, record.port};
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "the file does not exist yet";
  for (;;) {
    FileRecord record;
    if (read_record(path, record)) {
      EMBER_CHECK(record.world_size == self.world_size, kOp, "world size mismatch at ", method.url,
                  ": the file has world_size=", record.world_size, " (", describe(record),
                  "), rank ", self.rank, " has world_size=", self.world_size,
                  " (or the file is stale, from an earlier run)");
      // The store at the file's address must answer with the file's nonce: a stale file names
      // a store that is gone (or belongs to another run).
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        TcpStore probe(record.host, record.port, self.world_size, false,
                       std::max(std::chrono::milliseconds(1),
                                std::min(left, std::chrono::milliseconds(2000))));
        const std::string nonce = probe.get("ember/init/file/nonce");
        if (nonce == record.nonce) {
          auto store = shared_store(record.host, record.port, self.world_size, self.rank, timeout);
          meet(*store, method.url, self, timeout);
          return {record.host, record.port};
        }
        last =
            "the store answers with nonce " + nonce + ", not the file's (" + describe(record) + ")";
      } catch (const Error& e) {
        last =
            "the file names a store that does not answer (" + describe(record) + "): " + e.what();
      }
    }
    if (std::chrono::steady_clock::now() + std::chrono::milliseconds(50) > deadline) {
      throw Error(std::string(kOp) + ": rank " + std::to_string(self.rank) + " found no live " +
                  "rendezvous at " + method.url + " within " + std::to_string(timeout.count()) +
                  " ms: " + last + ". A file left by an earlier run is stale: delete it");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// A number one launcher stored for the others, checked: without a job secret anybody who
// reaches the launchers' store can write its keys.
int64_t stored_number(const std::string& key, const std::string& text, int64_t lo, int64_t hi) {
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  EMBER_CHECK(
      error == std::errc() && end == text.data() + text.size() && value >= lo && value <= hi,
      "ember-run", "the launchers' store holds \"", text.substr(0, 40), "\" at ", key,
      ", not a number from ", lo, " to ", hi);
  return value;
}

// The most launchers that may join one elastic job, and rounds it may have: a bound on what
// the master scans (the store's counters are untrusted without a job secret).
constexpr int64_t kMostJoins = 1 << 20;

// "2.5 s" for 2500 ms.
std::string in_seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out.precision(3);
  out << static_cast<double>(ms.count()) / 1000 << " s";
  return out.str();
}

}  // namespace

InitMethod parse_init_method(const std::string& url) {
  InitMethod m;
  m.url = url.empty() ? "env://" : url;
  const size_t sep = m.url.find("://");
  EMBER_CHECK(sep != std::string::npos, kOp, "init_method \"", m.url,
              "\" is not a URL (expected env://, tcp://HOST:PORT or file:///PATH)");
  m.scheme = m.url.substr(0, sep);
  const std::string rest = m.url.substr(sep + 3);
  if (m.scheme == "env") {
    EMBER_CHECK(rest.empty(), kOp, "init_method \"", m.url,
                "\": env:// takes nothing after it (MASTER_ADDR and MASTER_PORT say where)");
  } else if (m.scheme == "tcp") {
    std::string hostport = rest;
    if (!hostport.empty() && hostport.back() == '/') hostport.pop_back();
    size_t colon = std::string::npos;
    if (!hostport.empty() && hostport.front() == '[') {  // [IPv6]:port
      const size_t close = hostport.find(']');
      EMBER_CHECK(close != std::string::npos, kOp, "init_method \"", m.url, "\": unclosed '['");
      m.host = hostport.substr(1, close - 1);
      if (close + 1 < hostport.size() && hostport[close + 1] == ':') colon = close + 1;
      EMBER_CHECK(colon != std::string::npos || close + 1 == hostport.size(), kOp, "init_method \"",
                  m.url, "\": expected tcp://[ADDRESS]:PORT");
    } else {
      colon = hostport.rfind(':');
      m.host = hostport.substr(0, colon);
    }
    EMBER_CHECK(!m.host.empty(), kOp, "init_method \"", m.url,
                "\" has no host (expected tcp://HOST:PORT)");
    EMBER_CHECK(colon != std::string::npos, kOp, "init_method \"", m.url,
                "\" has no port (expected tcp://HOST:PORT)");
    EMBER_CHECK(m.host.find('/') == std::string::npos, kOp, "init_method \"", m.url,
                "\": tcp:// takes HOST:PORT only, no path");
    m.port = parse_port(m.url, hostport.substr(colon + 1));
  } else if (m.scheme == "file") {
    EMBER_CHECK(!rest.empty(), kOp, "init_method \"", m.url,
                "\" has no path (expected file:///PATH)");
    m.path = rest;
  } else {
    throw Error(std::string(kOp) + ": init_method \"" + m.url + "\" has an unknown scheme \"" +
                m.scheme + "\" (expected env://, tcp://HOST:PORT or file:///PATH)");
  }
  return m;
}

LaunchEnv resolve_identity(const InitMethod& method, int rank, int world_size,
                           const LaunchEnv& launch) {
  EMBER_CHECK(world_size == -1 || world_size >= 1, kOp, "world_size=", world_size,
              " must be at least 1 (or -1: from the launcher)");
  EMBER_CHECK(rank >= -1, kOp, "rank=", rank, " must not be negative (or -1: from the launcher)");
  LaunchEnv self = launch;
  if (launch.launcher == "mpirun") {
    // mpirun decides; explicit values may only repeat what it says.
    EMBER_CHECK((rank == -1 || rank == launch.rank) &&
                    (world_size == -1 || world_size == launch.world_size),
                kOp, "rank=", rank, ", world_size=", world_size, " disagree with mpirun's rank ",
                launch.rank, " of ", launch.world_size,
                "; under mpirun leave them unset (-1) or give mpirun's values");
    if (method.scheme == "tcp") {  // the TCP backend's ranks meet there (MPI ignores it)
      self.master_addr = method.host;
      self.master_port = method.port;
    }
    return self;
  }
  if (method.scheme == "env") {
    if (rank == -1 && world_size == -1) return self;
    EMBER_CHECK(rank != -1 && world_size != -1, kOp, "init_method \"", method.url,
                "\": give both rank and world_size or neither (got rank=", rank,
                ", world_size=", world_size, ")");
  } else {
    EMBER_CHECK(rank != -1 && world_size != -1, kOp, "init_method \"", method.url,
                "\" needs an explicit rank and world_size (got rank=", rank,
                ", world_size=", world_size, ")");
  }
  EMBER_CHECK(rank < world_size, kOp, "rank=", rank, " is not in [0, ", world_size,
              ") (world_size=", world_size, ")");
  if (launch.launcher == "none" || launch.rank != rank || launch.world_size != world_size) {
    // The URL and the explicit values describe the job; LOCAL_RANK still picks the GPU.
    const char* local = std::getenv("LOCAL_RANK");
    self.local_rank = local != nullptr && local[0] != '\0' ? std::atoi(local) : rank;
    self.launcher = "init_method";
  }
  self.rank = rank;
  self.world_size = world_size;
  if (method.scheme == "tcp") {
    self.master_addr = method.host;
    self.master_port = method.port;
  }
  return self;
}

StoreAddress rendezvous(const InitMethod& method, const LaunchEnv& self, const std::string& backend,
                        std::chrono::milliseconds timeout) {
  if (method.scheme == "file") return file_rendezvous(method, self, timeout);
  StoreAddress address{self.master_addr, self.master_port};
  if (method.scheme == "env") {
    EMBER_CHECK(!address.host.empty() && address.port > 0, kOp,
                "MASTER_ADDR and MASTER_PORT must be set (", self.launcher, " launch of ",
                self.world_size, " processes, ", backend, " backend) for init_method env://");
  }
  auto store = shared_store(address.host, address.port, self.world_size, self.rank, timeout);
  meet(*store, method.url + " (" + address.host + ":" + std::to_string(address.port) + ")", self,
       timeout);
  return address;
}

int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

LauncherRendezvous::LauncherRendezvous(const std::string& host, int port, int nnodes, int node_rank,
                                       int nproc_per_node, std::chrono::milliseconds timeout,
                                       const std::string& secret)
    : host_(host), port_(port), nnodes_(nnodes), node_rank_(node_rank), timeout_(timeout) {
  TcpStoreOptions options;
  options.secret = secret;
  store_ = std::make_unique<TcpStore>(host, port, nnodes, node_rank == 0, timeout, options);
  const int64_t seen = store_->add("ember-run/node/" + std::to_string(node_rank), 1);
  EMBER_CHECK(seen == 1, "ember-run", "two launchers have --node-rank ", node_rank, " (--nnodes ",
              nnodes, ", store ", host, ":", port, ")");
  if (node_rank == 0) {
    store_->set("ember-run/nproc_per_node", std::to_string(nproc_per_node));
    return;
  }
  const std::string theirs = store_->get("ember-run/nproc_per_node");
  if (theirs != std::to_string(nproc_per_node)) {
    const std::string what = "node " + std::to_string(node_rank) + " has --nproc-per-node " +
                             std::to_string(nproc_per_node) + " but node 0 has " + theirs;
    report_failure(0, 0, what, true);
    store_->add(key(0, "settled"), 1);  // no workers to stop: node 0 need not wait for this one
    throw Error("ember-run: " + what);
  }
}

LauncherRendezvous::LauncherRendezvous(const std::string& host, int port,
                                       const ElasticOptions& elastic, int nproc_per_node,
                                       std::chrono::milliseconds timeout, const std::string& secret)
    : host_(host),
      port_(port),
      nnodes_(elastic.max_nodes),
      node_rank_(-1),
      timeout_(timeout),
      elastic_(true),
      e_(elastic) {
  EMBER_CHECK(e_.min_nodes >= 1 && e_.min_nodes <= e_.max_nodes, "ember-run", "--nnodes ",
              e_.min_nodes, ":", e_.max_nodes, " needs 1 <= MIN <= MAX");
  EMBER_CHECK(e_.heartbeat_timeout >= std::chrono::milliseconds(100), "ember-run",
              "--heartbeat-timeout of ", e_.heartbeat_timeout.count(),
              " ms is too short (0.1 s at least)");
  TcpStoreOptions options;
  options.secret = secret;
  // A master that stopped answering is noticed within the heartbeat timeout.
  options.reply_timeout = e_.heartbeat_timeout;
  options.shutdown_grace = std::chrono::seconds(2);  // the others poll every 20-100 ms
  std::string not_served;
  try {
    store_ = std::make_unique<TcpStore>(host, port, e_.max_nodes, true, timeout, options);
    master_ = true;
  } catch (const Error& e) {  // another launcher serves it, or the address is another host's
    not_served = e.what();
  }
  if (!master_) {
    try {
      store_ = std::make_unique<TcpStore>(host, port, e_.max_nodes, false, timeout, options);
    } catch (const Error& e) {
      throw Error("ember-run: could neither serve the launchers' store on " + host + ":" +
                  std::to_string(port) + " (" + not_served + ") nor reach it (" + e.what() + ")");
    }
  }
  const std::string config = "--nproc-per-node " + std::to_string(nproc_per_node) + " --nnodes " +
                             std::to_string(e_.min_nodes) + ":" + std::to_string(e_.max_nodes) +
                             " --max-restarts " + std::to_string(e_.max_restarts);
  if (master_) {
    set("ember-run/config", config);
    add("ember-run/config/set", 1);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (counter("ember-run/config/set") == 0) {
      EMBER_CHECK(std::chrono::steady_clock::now() < deadline, "ember-run", "the store at ", host,
                  ":", port, " is not an elastic ember-run's (--nnodes MIN:MAX on every node)");
      pause();
    }
    const std::string theirs = get("ember-run/config");
    EMBER_CHECK(theirs == config, "ember-run", "this launcher has ", config,
                " but the master launcher (serving ", host, ":", port, ") has ", theirs);
    id_ = add("ember-run/ids", 1);
  }
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  set("ember-run/info/" + std::to_string(id_), "pid " + std::to_string(::getpid()) + " on " + name);
  if (master_) return;
  beat_store_ = std::make_unique<TcpStore>(host, port, e_.max_nodes, false, timeout, options);
  beat_ = std::thread([this] { heartbeat_loop(); });
}

LauncherRendezvous::~LauncherRendezvous() {
  if (beat_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(beat_mutex_);
      beat_stop_ = true;
    }
    beat_cv_.notify_all();
    beat_.join();
  }
}

void LauncherRendezvous::heartbeat_loop() {
  const std::string beat_key = "ember-run/hb/" + std::to_string(id_);
  const auto every =
      std::max<std::chrono::milliseconds>(e_.heartbeat_timeout / 5, std::chrono::milliseconds(20));
  std::unique_lock<std::mutex> lock(beat_mutex_);
  while (!beat_stop_) {
    lock.unlock();
    try {
      beat_store_->add(beat_key, 1);
    } catch (const std::exception& e) {
      lock.lock();
      store_lost_ = e.what();
      return;
    }
    lock.lock();
    beat_cv_.wait_for(lock, every, [&] { return beat_stop_; });
  }
}

bool LauncherRendezvous::can_report() {
  std::lock_guard<std::mutex> lock(beat_mutex_);
  return store_lost_.empty() && !dropped_;
}

std::string LauncherRendezvous::key(int round, const std::string& name) const {
  return "ember-run/round/" + std::to_string(round) + "/" + name;
}

int64_t LauncherRendezvous::counter(const std::string& name) { return add(name, 0); }

int64_t LauncherRendezvous::join_count() {
  const int64_t ids = counter("ember-run/ids");
  EMBER_CHECK(ids >= 0 && ids <= kMostJoins, "ember-run", "the launchers' store holds ", ids,
              " at ember-run/ids, not a number of launchers from 0 to ", kMostJoins);
  return ids;
}

std::string LauncherRendezvous::node_name(int64_t id) {
  auto it = names_.find(id);
  if (it == names_.end()) {
    const std::string info = get("ember-run/info/" + std::to_string(id));
    it = names_.emplace(id, info.substr(0, 200)).first;
  }
  return (id == 0 ? "the master launcher ("
                  : "the launcher joined as #" + std::to_string(id) + " (") +
         it->second + ")";
}

Error LauncherRendezvous::store_gone(const std::string& why) {
  std::lock_guard<std::mutex> lock(beat_mutex_);
  if (store_lost_.empty()) store_lost_ = why;
  return Error("ember-run: the launchers' store at " + host_ + ":" + std::to_string(port_) +
               ", served by the master launcher, stopped answering (" + store_lost_ +
               "). The master launcher's node is the job's single point of failure, as "
               "torchrun's c10d store host: the job cannot go on without it");
}

int64_t LauncherRendezvous::add(const std::string& name, int64_t delta) {
  try {
    return store_->add(name, delta);
  } catch (const Error& e) {
    if (!elastic_ || master_) throw;
    throw store_gone(e.what());
  }
}

void LauncherRendezvous::set(const std::string& name, const std::string& value) {
  try {
    store_->set(name, value);
  } catch (const Error& e) {
    if (!elastic_ || master_) throw;
    throw store_gone(e.what());
  }
}

std::string LauncherRendezvous::get(const std::string& name) {
  try {
    return store_->get(name);
  } catch (const Error& e) {
    if (!elastic_ || master_) throw;
    throw store_gone(e.what());
  }
}

void LauncherRendezvous::check_standing() {
  if (master_) return;
  {
    std::unique_lock<std::mutex> lock(beat_mutex_);
    if (!store_lost_.empty()) {
      const std::string why = store_lost_;
      lock.unlock();
      throw store_gone(why);
    }
  }
  const std::string me = std::to_string(id_);
  if (counter("ember-run/lost/" + me) > 0) {
    std::lock_guard<std::mutex> lock(beat_mutex_);
    dropped_ = true;
  }
  EMBER_CHECK(!dropped_, "ember-run", "this launcher (#", id_,
              ") was dropped from the job: the master launcher saw no heartbeat from it for ",
              in_seconds(e_.heartbeat_timeout),
              " (--heartbeat-timeout; was it stopped or cut off?). Start it again to rejoin");
  EMBER_CHECK(counter("ember-run/refused/" + me) == 0, "ember-run",
              "the job has no restarts left (--max-restarts ", e_.max_restarts,
              ") to start a round that admits this launcher");
}

const std::vector<int64_t>& LauncherRendezvous::members(int round) {
  auto it = members_.find(round);
  if (it != members_.end()) return it->second;
  static const std::vector<int64_t> none;
  if (counter("ember-run/closed") <= round) return none;  // not formed yet
  const std::string list_key = key(round, "members");
  const std::string list = get(list_key);
  std::vector<int64_t> ids;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    ids.push_back(stored_number(list_key, list.substr(start, comma - start), 0,
                                std::numeric_limits<int64_t>::max()));
    EMBER_CHECK(ids.size() <= static_cast<size_t>(e_.max_nodes), "ember-run",
                "the launchers' store holds more than ", e_.max_nodes, " members at ", list_key);
    start = comma + 1;
  }
  return members_.emplace(round, std::move(ids)).first->second;
}

int64_t LauncherRendezvous::expected(int round) {
  if (!elastic_) return nnodes_;
  return static_cast<int64_t>(members(round).size()) - counter(key(round, "lost"));
}

void LauncherRendezvous::pause() {
  if (interrupt_) interrupt_();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

void LauncherRendezvous::leave(int round, int64_t wall_ns, const std::string& what) {
  if (!elastic_ || master_ || !can_report()) return;
  const std::vector<int64_t>& in_round = members(round);
  if (std::find(in_round.begin(), in_round.end(), id_) != in_round.end()) {
    report_failure(round, wall_ns, what);  // before the master counts it lost: settled by then
  }
  add("ember-run/lost/" + std::to_string(id_), 1);
  std::lock_guard<std::mutex> lock(beat_mutex_);
  dropped_ = true;
}

std::vector<std::pair<int64_t, bool>> LauncherRendezvous::watch_heartbeats() {
  std::vector<std::pair<int64_t, bool>> fresh;
  const auto now = std::chrono::steady_clock::now();
  const int64_t ids = join_count();
  for (int64_t id = 1; id <= ids; ++id) {
    if (lost_.count(id) > 0) continue;
    const std::string lost_key = "ember-run/lost/" + std::to_string(id);
    const int64_t beats = counter("ember-run/hb/" + std::to_string(id));
    Seen& seen = seen_[id];
    if (counter(lost_key) > 0) {  // it left
      lost_.insert(id);
      fresh.emplace_back(id, true);
    } else if (seen.beats != beats) {  // it moved since the last look: alive now
      seen = {beats, now};
    } else if (now - seen.since > e_.heartbeat_timeout) {
      lost_.insert(id);
      add(lost_key, 1);
      fresh.emplace_back(id, false);
    }
  }
  return fresh;
}

void LauncherRendezvous::oversee(int round) {
  const auto fresh = watch_heartbeats();
  const std::vector<int64_t>& in_round = members(round);
  auto member = [&](int64_t id) {
    return std::find(in_round.begin(), in_round.end(), id) != in_round.end();
  };
  for (const auto& [id, left] : fresh) {
    if (!member(id)) continue;
    add(key(round, "lost"), 1);
    if (left) continue;  // it recorded why itself (leave)
    report_failure(round, wall_clock_ns(),
                   node_name(id) + " was lost: no heartbeat for " +
                       in_seconds(e_.heartbeat_timeout) + " (--heartbeat-timeout)");
  }
  if (newcomer_round_ == round || in_round.size() >= static_cast<size_t>(e_.max_nodes)) return;
  const int64_t ids = join_count();
  for (int64_t id = 1; id <= ids; ++id) {
    if (lost_.count(id) > 0 || refused_.count(id) > 0 || member(id)) continue;
    if (counter("ember-run/want/" + std::to_string(id)) - 1 <= round) continue;  // not asking
    if (round < e_.max_restarts) {
      newcomer_round_ = round;
      report_failure(round, wall_clock_ns(),
                     node_name(id) + " asks to join: the next round admits it");
      return;
    }
    refused_.insert(id);
    add("ember-run/refused/" + std::to_string(id), 1);
  }
}

int LauncherRendezvous::first_round() {
  if (master_) return 0;
  const int64_t closed = counter("ember-run/closed");
  EMBER_CHECK(closed >= 0 && closed <= kMostJoins, "ember-run", "the launchers' store holds ",
              closed, " at ember-run/closed, not a number of rounds from 0 to ", kMostJoins);
  return static_cast<int>(closed);
}

void LauncherRendezvous::close_round(int round, const std::vector<int64_t>& ids) {
  std::string list;
  for (const int64_t id : ids) {
    if (!list.empty()) list += ',';
    list += std::to_string(id);
  }
  set(key(round, "port"), std::to_string(pick_free_port(host_)));
  set(key(round, "members"), list);
  members_[round] = ids;
  add("ember-run/closed", 1);  // the others read the round's keys once this moves
}

RoundPlan LauncherRendezvous::begin_round(int round) {
  if (!elastic_) {
    add(key(round, "arrived"), 1);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (int64_t arrived = 0; (arrived = add(key(round, "arrived"), 0)) < nnodes_;) {
      if (failed(round)) throw Error("ember-run: " + settle_failure(round));
      EMBER_CHECK(std::chrono::steady_clock::now() < deadline, "ember-run", "node ", node_rank_,
                  ": only ", arrived, " of ", nnodes_, " launchers reached round ", round,
                  " within ", timeout_.count(), " ms");
      pause();
    }
    RoundPlan plan;
    plan.node_rank = node_rank_;
    plan.nnodes = nnodes_;
    if (node_rank_ == 0) {
      plan.port = pick_free_port(host_);
      set(key(round, "port"), std::to_string(plan.port));
    } else {
      const std::string port_key = key(round, "port");
      plan.port = static_cast<int>(stored_number(port_key, get(port_key), 1, 65535));
    }
    return plan;
  }
  check_standing();
  add("ember-run/want/" + std::to_string(id_), round + 1 - wanted_);
  wanted_ = round + 1;
  RoundPlan plan;
  if (master_) {
    using Clock = std::chrono::steady_clock;
    const auto deadline = Clock::now() + timeout_;
    bool enough = false;  // min_nodes have asked, since enough_since
    Clock::time_point enough_since{};
    for (;;) {
      watch_heartbeats();
      std::vector<int64_t> asked{0};
      const int64_t ids = join_count();
      for (int64_t id = 1; id <= ids; ++id) {
        if (lost_.count(id) > 0 || refused_.count(id) > 0) continue;
        if (counter("ember-run/want/" + std::to_string(id)) >= round + 1) asked.push_back(id);
      }
      bool pending = false;  // a live member of the round before, still stopping its workers
      if (round > 0) {
        for (const int64_t id : members(round - 1)) {
          pending = pending || (lost_.count(id) == 0 &&
                                std::find(asked.begin(), asked.end(), id) == asked.end());
        }
      }
      const auto now = Clock::now();
      if (asked.size() >= static_cast<size_t>(e_.max_nodes)) {
        asked.resize(static_cast<size_t>(e_.max_nodes));
        close_round(round, asked);
        break;
      }
      if (asked.size() >= static_cast<size_t>(e_.min_nodes)) {
        if (!enough) enough_since = now;
        enough = true;
        if ((!pending && now - enough_since >= e_.last_call) || now >= deadline) {
          close_round(round, asked);
          break;
        }
      } else {
        enough = false;
        EMBER_CHECK(now < deadline, "ember-run", "only ", asked.size(), " of at least ",
                    e_.min_nodes, " launchers (--nnodes ", e_.min_nodes, ":", e_.max_nodes,
                    ") reached round ", round, " within ", timeout_.count(), " ms");
      }
      pause();
    }
  } else {
    for (;;) {
      check_standing();
      if (const int64_t over = counter("ember-run/over"); over > 0) {
        plan.job_over = true;
        plan.job_succeeded = over == 1;
        return plan;
      }
      if (counter("ember-run/closed") > round) break;
      pause();
    }
  }
  const std::vector<int64_t>& in_round = members(round);
  plan.nnodes = static_cast<int>(in_round.size());
  const auto me = std::find(in_round.begin(), in_round.end(), id_);
  if (me == in_round.end()) return plan;  // the round is full: a spare
  plan.node_rank = static_cast<int>(me - in_round.begin());
  const std::string port_key = key(round, "port");
  plan.port = static_cast<int>(stored_number(port_key, get(port_key), 1, 65535));
  return plan;
}

void LauncherRendezvous::report_failure(int round, int64_t wall_ns, const std::string& what,
                                        bool final) {
  if (final) add("ember-run/stopped", 1);
  const int64_t n = add(key(round, "failures"), 1);
  set(key(round, "failure/" + std::to_string(n)), std::to_string(wall_ns) + " " + what);
  add(key(round, "failed"), 1);
}

bool LauncherRendezvous::failed(int round) { return add(key(round, "failed"), 0) > 0; }

bool LauncherRendezvous::poll(int round) {
  if (elastic_) {
    if (master_)
      oversee(round);
    else
      check_standing();
  }
  return failed(round);
}

bool LauncherRendezvous::stopped() { return add("ember-run/stopped", 0) > 0; }

std::string LauncherRendezvous::settle_failure(int round) {
  add(key(round, "settled"), 1);
  // A launcher that died (SIGKILL, its host gone) never settles: after a short wait the
  // failures recorded so far name the cause. In elastic mode the master drops it sooner, when
  // its heartbeat stops.
  const auto wait = std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(30));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::string missing;
  for (int64_t settled = 0; (settled = add(key(round, "settled"), 0)) < expected(round);) {
    if (std::chrono::steady_clock::now() > deadline) {
      const int64_t all = elastic_ ? static_cast<int64_t>(members(round).size()) : nnodes_;
      missing = " (" + std::to_string(expected(round) - settled) + " of " + std::to_string(all) +
                " launchers did not answer within " + std::to_string(wait.count()) + " ms)";
      break;
    }
    if (master_ && elastic_) oversee(round);
    pause();
  }
  // Every launcher records its failure (one at most a round; the elastic master also one per
  // lost member and one for a newcomer) before it settles: all are in now.
  const int64_t most = elastic_ ? 2 * int64_t{nnodes_} + 1 : nnodes_;
  const int64_t n = std::min<int64_t>(add(key(round, "failures"), 0), most);
  std::pair<int64_t, std::string> first{INT64_MAX, "a failure nobody recorded"};
  for (int64_t i = 1; i <= n; ++i) {
    const std::string record_key = key(round, "failure/" + std::to_string(i));
    const std::string record = get(record_key);
    const size_t space = std::min(record.find(' '), record.size());
    const int64_t when =
        stored_number(record_key, record.substr(0, space), 0, std::numeric_limits<int64_t>::max());
    if (when < first.first) first = {when, record.substr(std::min(space + 1, record.size()))};
  }
  return first.second + missing;
}

int LauncherRendezvous::report_done(int round) {
  return static_cast<int>(add(key(round, "done"), 1));
}

int LauncherRendezvous::done(int round) { return static_cast<int>(add(key(round, "done"), 0)); }

void LauncherRendezvous::finish(bool succeeded) {
  if (elastic_ && master_) add("ember-run/over", succeeded ? 1 : 2);
}

}  // namespace ember::dist::detail

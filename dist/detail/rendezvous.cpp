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

LauncherRendezvous::LauncherRendezvous(const std::string& host, int port, int nnodes, int node_rank,
                                       int nproc_per_node, std::chrono::milliseconds timeout,
                                       const std::string& secret)
    : host_(host), nnodes_(nnodes), node_rank_(node_rank), timeout_(timeout) {
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

LauncherRendezvous::~LauncherRendezvous() = default;

std::string LauncherRendezvous::key(int round, const std::string& name) const {
  return "ember-run/round/" + std::to_string(round) + "/" + name;
}

int LauncherRendezvous::begin_round(int round) {
  store_->add(key(round, "arrived"), 1);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (int64_t arrived = 0; (arrived = store_->add(key(round, "arrived"), 0)) < nnodes_;) {
    if (failed(round)) throw Error("ember-run: " + settle_failure(round));
    EMBER_CHECK(std::chrono::steady_clock::now() < deadline, "ember-run", "node ", node_rank_,
                ": only ", arrived, " of ", nnodes_, " launchers reached round ", round, " within ",
                timeout_.count(), " ms");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (node_rank_ == 0) {
    const int port = pick_free_port(host_);
    store_->set(key(round, "port"), std::to_string(port));
    return port;
  }
  const std::string port_key = key(round, "port");
  return static_cast<int>(stored_number(port_key, store_->get(port_key), 1, 65535));
}

void LauncherRendezvous::report_failure(int round, int64_t wall_ns, const std::string& what,
                                        bool final) {
  if (final) store_->add("ember-run/stopped", 1);
  const int64_t n = store_->add(key(round, "failures"), 1);
  store_->set(key(round, "failure/" + std::to_string(n)), std::to_string(wall_ns) + " " + what);
  store_->add(key(round, "failed"), 1);
}

bool LauncherRendezvous::failed(int round) { return store_->add(key(round, "failed"), 0) > 0; }

bool LauncherRendezvous::stopped() { return store_->add("ember-run/stopped", 0) > 0; }

std::string LauncherRendezvous::settle_failure(int round) {
  store_->add(key(round, "settled"), 1);
  // A launcher that died (SIGKILL, its host gone) never settles: after a short wait the
  // failures recorded so far name the cause.
  const auto wait = std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(30));
  const auto deadline = std::chrono::steady_clock::now() + wait;
  std::string missing;
  for (int64_t settled = 0; (settled = store_->add(key(round, "settled"), 0)) < nnodes_;) {
    if (std::chrono::steady_clock::now() > deadline) {
      missing = " (" + std::to_string(nnodes_ - settled) + " of " + std::to_string(nnodes_) +
                " launchers did not answer within " + std::to_string(wait.count()) + " ms)";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Every launcher records its failure (one at most a round) before it settles: all are in now.
  const int64_t n = std::min<int64_t>(store_->add(key(round, "failures"), 0), nnodes_);
  std::pair<int64_t, std::string> first{INT64_MAX, "a failure nobody recorded"};
  for (int64_t i = 1; i <= n; ++i) {
    const std::string record_key = key(round, "failure/" + std::to_string(i));
    const std::string record = store_->get(record_key);
    const size_t space = std::min(record.find(' '), record.size());
    const int64_t when =
        stored_number(record_key, record.substr(0, space), 0, std::numeric_limits<int64_t>::max());
    if (when < first.first) first = {when, record.substr(std::min(space + 1, record.size()))};
  }
  return first.second + missing;
}

int LauncherRendezvous::report_done(int round) {
  return static_cast<int>(store_->add(key(round, "done"), 1));
}

int LauncherRendezvous::done(int round) {
  return static_cast<int>(store_->add(key(round, "done"), 0));
}

}  // namespace ember::dist::detail

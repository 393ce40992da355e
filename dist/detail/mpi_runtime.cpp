#include "mpi_runtime.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include <ember/dist/flight_recorder.h>

#include "auth.h"
#include "flight.h"
#include "shared_store.h"

namespace ember::dist::detail {

namespace {

std::atomic<int> g_thread_level{-1};
std::atomic<bool> g_job_broken{false};
std::mutex g_serialized_mutex;

// The goodbyes still in flight (post_goodbye), with the buffers MPI writes to.
struct Goodbye {
  std::vector<char> mine, all;
  MPI_Request request = MPI_REQUEST_NULL;
  std::chrono::steady_clock::time_point until;  // given up at exit after this
};
std::mutex g_goodbye_mutex;
std::vector<std::unique_ptr<Goodbye>>& goodbyes() {
  static auto* pending = new std::vector<std::unique_ptr<Goodbye>>;
  return *pending;
}

// Drops the goodbyes that finished; with `at_exit`, first waits for the others until their
// time is up (a rank that never leaves or collects again). Under MpiLock.
void settle_goodbyes(bool at_exit) {
  std::lock_guard<std::mutex> lock(g_goodbye_mutex);
  auto& pending = goodbyes();
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    for (auto it = pending.begin(); it != pending.end();) {
      int done = 0;
      const bool failed = MPI_Test(&(*it)->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS;
      if (!done && (failed || (at_exit && now >= (*it)->until))) {
        // Given up on, not finished: MPI may still write into its buffers, so they stay
        // allocated until the process ends.
        (void)it->release();
      } else if (!done) {
        ++it;
        continue;
      }
      it = pending.erase(it);
    }
    if (!at_exit || pending.empty()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Finalises MPI at exit when ember initialised it (or aborts the job when a group broke).
struct MpiFinalizer {
  bool owned = false;
  ~MpiFinalizer() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!owned || finalized) return;
    if (g_job_broken.load()) {
      abort_mpi_job();
    } else {
      settle_goodbyes(/*at_exit=*/true);
      MPI_Finalize();
    }
  }
};

template <typename T, typename F>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const T*>(in);
  auto* b = static_cast<T*>(inout);
  const F combine;
  for (int i = 0; i < *len; ++i) {
    b[i] = T(combine(static_cast<float>(a[i]), static_cast<float>(b[i])));
  }
}
struct Add {
  float operator()(float a, float b) const { return a + b; }
};
struct Max {
  float operator()(float a, float b) const { return (a > b || a != a) ? a : b; }
};
struct Min {
  float operator()(float a, float b) const { return (a < b || a != a) ? a : b; }
};

struct HalfOps {
  MPI_Op half[3];  // sum, max, min
  MPI_Op bf16[3];
};

const HalfOps& half_ops() {
  static const HalfOps ops = [] {
    HalfOps o{};
    check_mpi(MPI_Op_create(&reduce_16bit<Half, Add>, 1, &o.half[0]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<Half, Max>, 1, &o.half[1]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<Half, Min>, 1, &o.half[2]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<BFloat16, Add>, 1, &o.bf16[0]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<BFloat16, Max>, 1, &o.bf16[1]), "MPI_Op_create");
    check_mpi(MPI_Op_create(&reduce_16bit<BFloat16, Min>, 1, &o.bf16[2]), "MPI_Op_create");
    return o;
  }();
  return ops;
}

const char* level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    default:
      return "MPI_THREAD_MULTIPLE";
  }
}

}  // namespace

// Serialised until MPI is known to allow MPI_THREAD_MULTIPLE.
std::atomic<std::mutex*> g_mpi_call_mutex{&g_serialized_mutex};

void check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  throw Error(what + ": " + std::string(text, static_cast<size_t>(length)) + " (MPI code " +
              std::to_string(code) + ")");
}

void ensure_mpi_initialized() {
  static std::mutex init_mutex;
  static MpiFinalizer finalizer;
  std::lock_guard<std::mutex> lock(init_mutex);
  if (g_thread_level.load() >= 0) return;
  int initialized = 0, finalized = 0;
  check_mpi(MPI_Initialized(&initialized), "MPI_Initialized");
  check_mpi(MPI_Finalized(&finalized), "MPI_Finalized");
  EMBER_CHECK(!finalized, "init_process_group", "MPI was already finalised");
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    check_mpi(MPI_Query_thread(&provided), "MPI_Query_thread");
  } else {
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    finalizer.owned = true;
  }
  EMBER_CHECK(provided >= MPI_THREAD_SERIALIZED, "init_process_group", "MPI provides only ",
              level_name(provided),
              "; ember's communication thread needs MPI_THREAD_SERIALIZED or better (initialise "
              "MPI with MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or let ember do it)");
  g_mpi_call_mutex.store(provided >= MPI_THREAD_MULTIPLE ? nullptr : &g_serialized_mutex);
  g_thread_level.store(provided);
}

void post_goodbye(MPI_Comm comm, const void* bytes, int count, int size,
                  std::chrono::milliseconds linger) {
  settle_goodbyes(/*at_exit=*/false);
  auto g = std::make_unique<Goodbye>();
  g->mine.assign(static_cast<const char*>(bytes), static_cast<const char*>(bytes) + count);
  g->all.resize(static_cast<size_t>(count) * static_cast<size_t>(size));
  g->until = std::chrono::steady_clock::now() + linger;
  if (MPI_Iallgather(g->mine.data(), count, MPI_BYTE, g->all.data(), count, MPI_BYTE, comm,
                     &g->request) != MPI_SUCCESS) {
    return;  // nobody to tell: the peers' own waits time out as before
  }
  std::lock_guard<std::mutex> lock(g_goodbye_mutex);
  goodbyes().push_back(std::move(g));
}

void mark_mpi_job_broken() { g_job_broken.store(true); }

void abort_mpi_job() {
  std::fflush(stdout);
  std::fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; should it, the process still ends
}

// --- the job's store --------------------------------------------------------------------------

namespace {

// A client of the job's store must reach it within this (or the timeout when shorter), trying
// each of rank 0's addresses for at most kJobStoreTry: rank 0 serves it before its addresses
// go out, so only an address of another host, or none, takes long.
constexpr auto kJobStoreConnect = std::chrono::seconds(30);
constexpr auto kJobStoreTry = std::chrono::milliseconds(3000);
// How often each rank looks for requests for its flight records, and how long one that asked
// waits for the answers.
constexpr auto kDumpCheck = std::chrono::milliseconds(250);
constexpr auto kDumpWait = std::chrono::seconds(3);
// The address's share of the broadcast: the port, then rank 0's addresses, NUL-terminated.
constexpr size_t kHostBytes = 256;
// The job store's secret as it travels (hex of 32 random bytes; all zero: the environment's).
constexpr size_t kSecretBytes = 64;

// This process's part of the job's store: the store (rank 0 serves it) and the thread that
// answers requests for flight records. Destroyed at exit before MPI is finalised (made after
// MPI was initialised), so the thread stops and the store's server says goodbye first.
struct JobStore {
  std::mutex mutex;                 // one mpi_job_store at a time; guards the next three
  std::shared_ptr<TcpStore> store;  // the first one made
  std::string host;                 // rank 0: its addresses, as they travel
  std::string secret;               // rank 0: the secret it drew ("": the environment's)
  std::shared_ptr<StoreFlightDumps> dumps;
  std::mutex watch_mutex;  // guards stopping
  std::condition_variable watch_cv;
  bool stopping = false;
  std::thread watcher;

  ~JobStore() {
    {
      std::lock_guard<std::mutex> lock(watch_mutex);
      stopping = true;
    }
    watch_cv.notify_all();
    if (watcher.joinable()) watcher.join();
    set_job_flight_dumps(nullptr);
    if (dumps != nullptr) dumps->leave();  // a rank that asks now need not wait for this one
  }
  // The watcher: answers the peers' requests for this rank's flight records, also while the
  // rank's other threads are stuck (in its own code, or in MPI).
  void watch(std::shared_ptr<StoreFlightDumps> answering) {
    std::unique_lock<std::mutex> lock(watch_mutex);
    while (!watch_cv.wait_for(lock, kDumpCheck, [&] { return stopping; })) {
      lock.unlock();
      const bool reachable = answering->answer(kDumpWait);
      lock.lock();
      if (!reachable) return;  // the store ended with rank 0: nobody can ask any more
    }
  }
};
JobStore& job_store() {
  static JobStore instance;
  return instance;
}

// Where rank 0 serves the job's store, and the addresses its peers try, in order: MASTER_ADDR
// when set; else every address (any port) and this host's IPv4 addresses outside loopback, in
// the order of its interfaces, then loopback (a job on one host).
struct JobStoreAddress {
  std::string bind;
  std::vector<std::string> candidates;
};
JobStoreAddress job_store_address() {
  if (const char* addr = std::getenv("MASTER_ADDR"); addr != nullptr && addr[0] != '\0') {
    return {addr, {addr}};
  }
  JobStoreAddress out{"0.0.0.0", {}};
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET ||
          (a->ifa_flags & IFF_UP) == 0 || (a->ifa_flags & IFF_LOOPBACK) != 0)
        continue;
      char text[INET_ADDRSTRLEN] = {};
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text,
                  sizeof(text));
      out.candidates.emplace_back(text);
    }
    ::freeifaddrs(list);
  }
  out.candidates.emplace_back("127.0.0.1");
  return out;
}

// Rank 0's addresses as they travel: separated by spaces, within kHostBytes (those that do
// not fit are left out).
std::string join_candidates(const std::vector<std::string>& candidates) {
  std::string out;
  for (const std::string& c : candidates) {
    if (out.size() + c.size() + 1 >= kHostBytes) break;
    out += (out.empty() ? "" : " ") + c;
  }
  return out;
}

// A client of the store at one of `candidates`:`port`, each tried for at most `per_try` (a
// refused one at once costs that too: the client retries), within `limit` in all.
std::shared_ptr<TcpStore> reach_job_store(const std::string& candidates, int port, int size,
                                          int rank, std::chrono::milliseconds limit,
                                          const std::optional<std::string>& secret) {
  std::istringstream words(candidates);
  std::string host, failures;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (words >> host) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    try {
      return shared_store(host, port, size, rank, std::min(left, kJobStoreTry), secret);
    } catch (const std::exception& e) {
      failures += (failures.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  throw Error("could not reach rank 0's store at any of " + candidates + " (port " +
              std::to_string(port) + "): " + failures);
}

// Without a job secret in the environment, the job store still accepts only the job's ranks:
// rank 0 draws one, and it travels to the others over MPI with the store's address.
std::string draw_job_store_secret() {
  if (!job_secret().empty()) return "";
  std::random_device device;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < kSecretBytes / 8; ++i) {
    const uint32_t word = device();
    for (int nibble = 0; nibble < 8; ++nibble) out += kHex[(word >> (4 * nibble)) & 0xf];
  }
  return out;
}

}  // namespace

std::shared_ptr<TcpStore> mpi_job_store(MPI_Comm comm, std::span<char> payload,
                                        std::chrono::milliseconds timeout) {
  ensure_mpi_initialized();
  int rank = 0, size = 1, world = 1;
  {
    MpiLock lock;
    check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(comm, &size), "MPI_Comm_size");
    check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &world), "MPI_Comm_size");
  }
  EMBER_ASSERT(size == world, "mpi_job_store: a communicator of ", size, " ranks, not the job's ",
               world);
  const auto connect = std::min<std::chrono::milliseconds>(timeout, kJobStoreConnect);
  JobStore& job = job_store();
  std::lock_guard<std::mutex> job_lock(job.mutex);
  std::string failure;  // why this rank has no store
  std::vector<char> message(sizeof(int32_t) + kHostBytes + kSecretBytes + payload.size(), '\0');
  char* const secret_field = message.data() + sizeof(int32_t) + kHostBytes;
  char* const payload_field = secret_field + kSecretBytes;
  if (rank == 0) {
    try {
      if (job.store == nullptr) {
        const JobStoreAddress address = job_store_address();
        job.secret = draw_job_store_secret();
        job.store = serve_shared_store(
            address.bind, size, connect,
            job.secret.empty() ? std::nullopt : std::optional<std::string>(job.secret));
        job.host = join_candidates(address.candidates);
      }
      std::memcpy(secret_field, job.secret.data(), job.secret.size());
      const auto port = static_cast<int32_t>(job.store->port());
      std::memcpy(message.data(), &port, sizeof(port));
      std::memcpy(message.data() + sizeof(port), job.host.data(), job.host.size());
    } catch (const std::exception& e) {
      failure = e.what();
    }
    if (!payload.empty()) {
      std::memcpy(payload_field, payload.data(), payload.size());
    }
  }
  {
    MpiLock lock;
    check_mpi(MPI_Bcast(message.data(), static_cast<int>(message.size()), MPI_BYTE, 0, comm),
              "init_process_group: MPI_Bcast of the job's store address");
  }
  int32_t port = 0;
  std::memcpy(&port, message.data(), sizeof(port));
  const char* name = message.data() + sizeof(port);
  const std::string host(name, strnlen(name, kHostBytes - 1));
  if (rank != 0 && !payload.empty()) {
    std::memcpy(payload.data(), payload_field, payload.size());
  }
  std::shared_ptr<TcpStore> store;
  if (rank == 0) {
    if (failure.empty()) store = job.store;
  } else if (port > 0 && port <= 65535) {
    try {
      const std::string drawn(secret_field, strnlen(secret_field, kSecretBytes));
      store = reach_job_store(host, port, size, rank, connect,
                              drawn.empty() ? std::nullopt : std::optional<std::string>(drawn));
    } catch (const std::exception& e) {
      failure = e.what();
    }
  } else {
    failure = "rank 0 serves none";
  }
  int everyone = store != nullptr ? 1 : 0;
  {
    MpiLock lock;
    check_mpi(MPI_Allreduce(MPI_IN_PLACE, &everyone, 1, MPI_INT, MPI_MIN, comm),
              "init_process_group: MPI_Allreduce over the ranks that reached the job's store");
  }
  if (!everyone) {
    if (!failure.empty()) {
      std::fprintf(stderr,
                   "ember::dist: rank %d has no store for this MPI job (rank 0's addresses %s, "
                   "port %d): %s; the job runs "
                   "without one (no always-on check of NCCL collectives, no goodbyes there, and "
                   "flight records stay where each rank wrote them)\n",
                   rank, host.c_str(), static_cast<int>(port), failure.c_str());
      std::fflush(stderr);
    }
    return nullptr;
  }
  if (job.store == nullptr) job.store = store;
  if (job.dumps == nullptr && size > 1 && flight_recorder_enabled()) {
    job.dumps = std::make_shared<StoreFlightDumps>(
        job.store, "ember/mpi/flight/", rank, size,
        "a rank of the MPI job asked, its group having broken or timed out");
    set_job_flight_dumps(job.dumps);
    job.watcher = std::thread([&job, dumps = job.dumps] { job.watch(dumps); });
  }
  return store;
}

namespace {

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case kF32:
      return MPI_FLOAT;
    case kF64:
      return MPI_DOUBLE;
    case kF16:
    case kBF16:
      return MPI_UINT16_T;
    case kI64:
      return MPI_INT64_T;
    case kI32:
      return MPI_INT32_T;
    case kU8:
    case kBool:
      return MPI_UINT8_T;
  }
  EMBER_ASSERT(false, "mpi_type: unknown dtype");
  return MPI_DATATYPE_NULL;
}

MpiTypeOp mpi_type_op(DType dtype, ReduceOp op) {
  const int index = op == ReduceOp::kMax ? 1 : op == ReduceOp::kMin ? 2 : 0;
  if (dtype == kF16) return {MPI_UINT16_T, half_ops().half[index]};
  if (dtype == kBF16) return {MPI_UINT16_T, half_ops().bf16[index]};
  if (dtype == kBool) return {MPI_UINT8_T, index == 2 ? MPI_MIN : MPI_MAX};
  return {mpi_type(dtype), index == 0 ? MPI_SUM : index == 1 ? MPI_MAX : MPI_MIN};
}

}  // namespace

MpiTypeTable::MpiTypeTable() {
  for (int d = 0; d < kNumDTypes; ++d) {
    for (int r = 0; r < kNumReduceOps; ++r) {
      table_[d][r] = mpi_type_op(static_cast<DType>(d), static_cast<ReduceOp>(r));
    }
  }
}

}  // namespace ember::dist::detail

#include "flight.h"

#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include <ember/dist/flight_recorder.h>
#include <ember/dist/init.h>
#include <ember/dist/tcp_store.h>

#include "engine.h"

namespace ember::dist {

namespace {

thread_local const char* t_tag = nullptr;
thread_local detail::CallSite t_site;

// Tags live for the process: a recorded pointer stays valid whatever the thread does.
const char* intern_tag(std::string_view tag) {
  static std::mutex mutex;
  static auto* tags = new std::set<std::string, std::less<>>;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = tags->find(tag);
  if (it == tags->end()) it = tags->emplace(tag).first;
  return it->c_str();
}

std::mutex g_dir_mutex;
std::string& dir_override() {
  static auto* dir = new std::string;
  return *dir;
}

std::atomic<int> g_enabled{-1};  // -1: from the environment

}  // namespace

CollectiveTag::CollectiveTag(std::string_view tag) : previous_(t_tag) { t_tag = intern_tag(tag); }
CollectiveTag::~CollectiveTag() { t_tag = previous_; }

void set_flight_recorder_dir(const std::string& dir) {
  std::lock_guard<std::mutex> lock(g_dir_mutex);
  dir_override() = dir;
}

std::string flight_recorder_dir() {
  {
    std::lock_guard<std::mutex> lock(g_dir_mutex);
    if (!dir_override().empty()) return dir_override();
  }
  const char* env = std::getenv("EMBER_FLIGHT_DIR");
  return env != nullptr && env[0] != '\0' ? env : "ember-flight";
}

void set_flight_recorder_enabled(bool enabled) { g_enabled.store(enabled ? 1 : 0); }

bool flight_recorder_enabled() {
  int on = g_enabled.load();
  if (on < 0) {
    const char* env = std::getenv("EMBER_FLIGHT_RECORDER");
    on = env != nullptr && std::strcmp(env, "0") == 0 ? 0 : 1;
    g_enabled.store(on);
  }
  return on == 1;
}

std::string dump_flight_recorder(const std::string& reason) {
  const std::string path = detail::dump_flight_records(reason);
  EMBER_CHECK(!path.empty(), "dump_flight_recorder", "could not write the flight records to ",
              flight_recorder_dir(), " (see the message above)");
  return path;
}

namespace detail {

const char* current_collective_tag() { return t_tag; }

CallSite current_call_site() { return t_site; }

CallSiteScope::CallSiteScope(const std::source_location& where) : previous_(t_site) {
  t_site = {where.file_name(), static_cast<int32_t>(where.line())};
}
CallSiteScope::~CallSiteScope() { t_site = previous_; }

const char* flight_state_name(FlightState state) {
  switch (state) {
    case FlightState::kEnqueued:
      return "enqueued";
    case FlightState::kStarted:
      return "started";
    case FlightState::kCompleted:
      return "completed";
    case FlightState::kFailed:
      return "failed";
  }
  return "?";
}

namespace {

// The live recorders, for the dumps.
struct Registry {
  std::mutex mutex;
  std::vector<FlightRecorder*> recorders;
  int signal_pipe[2] = {-1, -1};
};
Registry& registry() {
  static auto* r = new Registry;  // never destroyed: dumps may run during exit
  return *r;
}

// SIGUSR1 writes a byte to a pipe (async-signal-safe); a thread reads it and dumps.
void on_sigusr1(int /*signal*/) {
  const int saved = errno;
  const char byte = 1;
  const ssize_t written = ::write(registry().signal_pipe[1], &byte, 1);
  (void)written;
  errno = saved;
}

// Once per process, with the first recorder: unless the program handles SIGUSR1 itself.
void install_sigusr1() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (::sigaction(SIGUSR1, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
    Registry& r = registry();
    if (::pipe2(r.signal_pipe, O_CLOEXEC) != 0) return;
    std::thread([fd = r.signal_pipe[0]] {
      char byte = 0;
      while (::read(fd, &byte, 1) == 1 || errno == EINTR) {
        dump_flight_records("SIGUSR1");
      }
    }).detach();
    struct sigaction action {};
    action.sa_handler = on_sigusr1;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR1, &action, nullptr);
  });
}

}  // namespace

FlightRecorder::FlightRecorder(const char* backend, int rank, std::vector<int> global_ranks,
                               int global_rank)
    : on_(flight_recorder_enabled()),
      backend_(backend),
      rank_(rank),
      global_ranks_(std::move(global_ranks)),
      global_rank_(global_rank) {
  if (!on_) return;
  ring_ = std::make_unique<Entry[]>(static_cast<size_t>(kCapacity));
  Registry& r = registry();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    for (const FlightRecorder* other : r.recorders) {
      if (std::strcmp(other->backend_, backend_) == 0 && other->global_ranks_ == global_ranks_)
        index_ = std::max(index_, other->index_ + 1);
    }
    r.recorders.push_back(this);
  }
  install_sigusr1();
}

FlightRecorder::~FlightRecorder() {
  if (!on_) return;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::erase(r.recorders, this);
}

void FlightRecorder::set_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(broken_mutex_);
  broken_ = reason;
}

// NOTE: the coarse clock (the last tick, 1 to 4 ms) costs a few nanoseconds where the
// precise one costs tens on a VM: a record's times need only tell seconds apart.
int64_t FlightRecorder::now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

std::string FlightRecorder::to_json() const {
  nlohmann::json group;
  group["backend"] = backend_;
  group["rank"] = rank_;
  group["size"] = global_ranks_.size();
  group["global_ranks"] = global_ranks_;
  group["index"] = index_;
  {
    std::lock_guard<std::mutex> lock(broken_mutex_);
    group["broken"] = broken_;
  }
  nlohmann::json entries = nlohmann::json::array();
  std::vector<nlohmann::json> found;
  for (int64_t i = 0; i < kCapacity; ++i) {
    const Entry& e = ring_[static_cast<size_t>(i)];
    const int64_t seq = e.seq.load(std::memory_order_acquire);
    if (seq <= 0) continue;  // empty, or being written
    nlohmann::json j;
    j["seq"] = seq;
    const int32_t kind = e.kind.load(std::memory_order_relaxed);
    j["op"] = kind >= 0 && kind <= static_cast<int32_t>(OpKind::kRecv)
                  ? op_kind_name(static_cast<OpKind>(kind))
                  : "?";
    const int32_t dtype = e.dtype.load(std::memory_order_relaxed);
    j["dtype"] = dtype >= 0 && dtype < kNumDTypes
                     ? std::string(dtype_name(static_cast<DType>(dtype)))
                     : std::string();
    j["numel"] = e.numel.load(std::memory_order_relaxed);
    j["bytes"] = dtype >= 0 && dtype < kNumDTypes
                     ? e.numel.load(std::memory_order_relaxed) *
                           static_cast<int64_t>(element_size(static_cast<DType>(dtype)))
                     : 0;
    j["root"] = e.root.load(std::memory_order_relaxed);
    const int32_t reduce = e.reduce.load(std::memory_order_relaxed);
    j["reduce"] =
        reduce >= 0 && reduce < kNumReduceOps ? reduce_op_name(static_cast<ReduceOp>(reduce)) : "";
    j["state"] =
        flight_state_name(static_cast<FlightState>(e.state.load(std::memory_order_relaxed)));
    j["enqueued_ns"] = e.enqueued_ns.load(std::memory_order_relaxed);
    j["started_ns"] = e.started_ns.load(std::memory_order_relaxed);
    j["ended_ns"] = e.ended_ns.load(std::memory_order_relaxed);
    const char* tag = e.tag.load(std::memory_order_relaxed);
    j["tag"] = tag != nullptr ? tag : "";
    const char* file = e.file.load(std::memory_order_relaxed);
    j["call_site"] = file != nullptr ? std::filesystem::path(file).filename().string() + ":" +
                                           std::to_string(e.line.load(std::memory_order_relaxed))
                                     : "";
    // Rewritten meanwhile: a newer collective took the slot; it is left out.
    if (e.seq.load(std::memory_order_acquire) != seq) continue;
    found.push_back(std::move(j));
  }
  std::sort(found.begin(), found.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["seq"].get<int64_t>() < b["seq"].get<int64_t>();
  });
  for (auto& j : found) entries.push_back(std::move(j));
  group["entries"] = std::move(entries);
  return group.dump();
}

namespace {

std::mutex g_last_dump_mutex;
std::string& last_dump() {
  static auto* text = new std::string;  // never destroyed: dumps may run during exit
  return *text;
}

// Writes `text`, rank `rank`'s dump, to <flight_recorder_dir()>/rank<R>.json atomically (a
// whole file or none); returns the path. Throws on failure.
std::filesystem::path write_dump_file(int64_t rank, const std::string& text) {
  const std::filesystem::path dir = flight_recorder_dir();
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / ("rank" + std::to_string(rank) + ".json");
  const std::filesystem::path partial =
      dir / ("rank" + std::to_string(rank) + ".json.tmp." + std::to_string(::getpid()));
  {
    std::ofstream out(partial, std::ios::trunc);
    out << text;
    out.close();
    if (!out) throw Error("cannot write " + partial.string());
  }
  std::filesystem::rename(partial, path);
  return path;
}

}  // namespace

std::string dump_flight_records(const std::string& reason) noexcept {
  try {
    Registry& r = registry();
    const LaunchEnv launch = read_launch_env();
    nlohmann::json dump;
    dump["ember_flight_recorder"] = 1;
    dump["reason"] = reason;
    dump["pid"] = static_cast<int64_t>(::getpid());
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    dump["host"] = host;
    dump["steady_now_ns"] = FlightRecorder::now_ns();
    dump["unix_now_ms"] = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
    int rank = launch.rank;
    nlohmann::json groups = nlohmann::json::array();
    {
      std::lock_guard<std::mutex> lock(r.mutex);
      for (const FlightRecorder* recorder : r.recorders) {
        groups.push_back(nlohmann::json::parse(recorder->to_json()));
      }
      if (!r.recorders.empty()) rank = r.recorders.front()->global_rank();
    }
    dump["rank"] = rank;
    dump["world_size"] = launch.world_size;
    dump["groups"] = std::move(groups);
    const std::string text = dump.dump(1) + "\n";
    const std::filesystem::path path = write_dump_file(rank, text);
    {
      std::lock_guard<std::mutex> lock(g_last_dump_mutex);
      last_dump() = text;
    }
    std::fprintf(stderr, "ember::dist: rank %d wrote its flight records to %s (%s)\n", rank,
                 path.c_str(), reason.c_str());
    std::fflush(stderr);
    return path.string();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ember::dist: could not write the flight records: %s\n", e.what());
    std::fflush(stderr);
    return "";
  }
}

std::string last_flight_dump() {
  std::lock_guard<std::mutex> lock(g_last_dump_mutex);
  return last_dump();
}

// --- dumps over a store -----------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;

// How often a rank that asked looks whether its peers answered.
constexpr auto kAnswerPoll = std::chrono::milliseconds(20);

// Checks `text`, what the store holds as rank `rank`'s dump (untrusted: any client of the
// store could have written it), before it is written: bounded, a dump, and that rank's.
// The count of a rank whose answer stands for every request, later ones included: one that
// asked itself (its dump, written when its group broke) or whose process ended (none).
constexpr int64_t kForGood = int64_t{1} << 50;

void check_peer_dump(const std::string& text, int rank) {
  if (text.empty()) throw Error("it had ended, or could write none");
  if (text.size() > kMaxFlightDumpBytes) {
    throw Error("the store holds " + std::to_string(text.size()) +
                " bytes for it, more than a dump may take (" + std::to_string(kMaxFlightDumpBytes) +
                ")");
  }
  const nlohmann::json dump = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  const bool ours = dump.is_object() && dump.contains("ember_flight_recorder") &&
                    dump["ember_flight_recorder"] == 1 && dump.contains("rank") &&
                    dump["rank"].is_number_integer() && dump["rank"].get<int64_t>() == rank;
  if (!ours) {
    throw Error("the store holds no dump of rank " + std::to_string(rank) +
                " for it (not a flight-recorder dump, or another rank's)");
  }
}

}  // namespace

StoreFlightDumps::StoreFlightDumps(std::shared_ptr<TcpStore> store, std::string prefix, int rank,
                                   int size, std::string answer_reason)
    : store_(std::move(store)),
      prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      answer_reason_(std::move(answer_reason)) {
  EMBER_CHECK(store_ != nullptr && rank >= 0 && rank < size, "StoreFlightDumps", "rank ", rank,
              " of ", size, store_ == nullptr ? " without a store" : " is not a rank");
}

std::string StoreFlightDumps::key(const char* kind, int rank) const {
  return prefix_ + kind + "/" + std::to_string(rank);
}

void StoreFlightDumps::publish(int64_t through) {
  const std::string text = last_flight_dump();
  std::lock_guard<std::mutex> lock(mutex_);
  if (through <= answered_) return;
  // Empty when none could be written: the asker need not wait for it.
  store_->set(key("dump", rank_), text);
  store_->add(key("answered", rank_), through - answered_);
  answered_ = through;
}

void StoreFlightDumps::gather(int64_t number, std::chrono::milliseconds wait) {
  std::vector<int> pending;
  for (int r = 0; r < size_; ++r)
    if (r != rank_) pending.push_back(r);
  std::vector<int> gathered{rank_};
  const auto until = Clock::now() + wait;
  while (!pending.empty()) {
    std::erase_if(pending, [&](int r) {
      if (store_->add(key("answered", r), 0) < number) return false;
      try {
        const std::string text = store_->get(key("dump", r));
        check_peer_dump(text, r);
        write_dump_file(r, text);
        gathered.push_back(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "ember::dist: rank %d could not gather rank %d's flight records: %s\n",
                     rank_, r, e.what());
      }
      return true;
    });
    if (pending.empty() || Clock::now() >= until) break;
    std::this_thread::sleep_for(kAnswerPoll);
  }
  std::sort(gathered.begin(), gathered.end());
  std::string message = "ember::dist: rank " + std::to_string(rank_) +
                        " holds the flight records of " + "ranks " + ranks_str(gathered) + " in " +
                        flight_recorder_dir();
  if (!pending.empty()) {
    message += "; ranks " + ranks_str(pending) + " did not answer within " +
               std::to_string(wait.count()) + " ms";
  }
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
}

void StoreFlightDumps::request(std::chrono::milliseconds wait) noexcept {
  if (size_ < 2) return;
  try {
    seen_.fetch_add(1);  // before the count grows: not this rank's to answer
    asked_.store(true);
    const int64_t number = store_->add(prefix_ + "requests", 1);
    publish(kForGood);  // a peer that asks too need not wait for this rank's thread
    gather(number, wait);
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "ember::dist: rank %d could not ask its peers for their flight records: %s\n",
                 rank_, e.what());
    std::fflush(stderr);
  }
}

void StoreFlightDumps::leave() noexcept {
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (answered_ >= kForGood) return;
    store_->set(key("dump", rank_), "");
    store_->add(key("answered", rank_), kForGood - answered_);
    answered_ = kForGood;
  } catch (const std::exception&) {
    // The store is gone: nobody can ask any more.
  }
}

bool StoreFlightDumps::answer(std::chrono::milliseconds wait) noexcept {
  try {
    const int64_t requests = store_->add(prefix_ + "requests", 0);
    int64_t seen = seen_.load();
    // Once per request, whichever of the threads that poll takes it.
    if (requests <= seen || !seen_.compare_exchange_strong(seen, requests)) return true;
    if (asked_.load()) return true;  // its own dump, written when its group broke, answers
    dump_flight_records(answer_reason_);
    publish(requests);
    if (rank_ == 0) gather(requests, wait);  // the job's folder holds them all
    return true;
  } catch (const std::exception&) {
    return false;  // the store is gone (rank 0 ended): nobody waits for the answer
  }
}

namespace {

std::mutex g_job_dumps_mutex;
std::shared_ptr<StoreFlightDumps>& job_dumps() {
  static auto* dumps = new std::shared_ptr<StoreFlightDumps>;  // asked for during exit too
  return *dumps;
}

}  // namespace

void set_job_flight_dumps(std::shared_ptr<StoreFlightDumps> dumps) {
  std::lock_guard<std::mutex> lock(g_job_dumps_mutex);
  job_dumps() = std::move(dumps);
}

void request_job_flight_dumps(std::chrono::milliseconds wait) noexcept {
  std::shared_ptr<StoreFlightDumps> dumps;
  {
    std::lock_guard<std::mutex> lock(g_job_dumps_mutex);
    dumps = job_dumps();
  }
  if (dumps != nullptr) dumps->request(wait);
}

}  // namespace detail

}  // namespace ember::dist

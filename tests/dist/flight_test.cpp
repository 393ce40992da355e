// The flight recorder (dist/flight_recorder.h): what a group records and dumps, SIGUSR1, and
// the analyzer on dumps written by hand, good and bad. Runs on every rank of the dist suite;
// each rank writes into a folder of its own.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <ember/dist/detail/flight.h>
#include <ember/dist/dist.h>
#include <ember/dist/tcp_store.h>

#include "dist_test_util.h"
#include "test_util.h"

namespace ember::dist {
namespace {

namespace fs = std::filesystem;
using ::ember::dist::testing::make_group;

// A fresh folder of this process's, removed at the end of the test; the dump folder is put
// back then.
struct ScratchDir {
  ScratchDir()
      : path(fs::temp_directory_path() /
             ("ember_flight_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++))),
        saved(flight_recorder_dir()) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~ScratchDir() {
    set_flight_recorder_dir(saved);
    fs::remove_all(path);
  }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name) << text;
  }
  fs::path path;
  std::string saved;
  static inline int counter = 0;
};

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(FlightRecorder, RecordsTaggedCollectivesAndDumpsOnRequest) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  auto pg = make_group(options);
  ScratchDir dir;
  set_flight_recorder_dir(dir.path.string());
  EXPECT_EQ(flight_recorder_dir(), dir.path.string());
  Tensor t = ones({256});
  {
    const CollectiveTag tag("warm-up");
    pg->allreduce(t)->wait();
    const CollectiveTag inner("inner step");  // the innermost tag wins
    pg->broadcast(t, 0)->wait();
  }
  pg->barrier()->wait();
  // Without a tag, a free function's collective records its call site (on the default group).
  {
    testing::DefaultGroupGuard guard;
    init_process_group(testing::cpu_init());
    Tensor u = ones({4});
    all_reduce(u);  // the line below names this one
    const int line = __LINE__ - 1;
    ScratchDir other;
    set_flight_recorder_dir(other.path.string());
    const std::string report = analyze_flight_dumps(fs::path(dump_flight_recorder()).parent_path());
    if (get_backend() != "single") {  // one process without a launcher records nothing
      EXPECT_TRUE(
          contains(report, "allreduce #1 (at flight_test.cpp:" + std::to_string(line) + ","))
          << report;
    }
    set_flight_recorder_dir(dir.path.string());
  }
  const std::string path = dump_flight_recorder("asked by the test");
  EXPECT_EQ(fs::path(path).filename().string(),
            "rank" + std::to_string(pg->global_rank()) + ".json");
  const std::string report = analyze_flight_dumps(dir.path.string());
  EXPECT_TRUE(contains(report, "completed barrier #3 (no data)")) << report;
  EXPECT_TRUE(contains(report, "agree on every collective they recorded")) << report;
  // Only this rank dumped into its folder: it says where it is, and who left no dump.
  const std::string me = "rank " + std::to_string(pg->global_rank());
  EXPECT_TRUE(contains(report, me + " is outside any collective: its last, barrier #3")) << report;
  if (pg->size() > 1) {
    EXPECT_TRUE(contains(report, "left no dump")) << report;
  }
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "\"tag\": \"warm-up\"")) << text;
  EXPECT_TRUE(contains(text, "\"tag\": \"inner step\"")) << text;
  EXPECT_TRUE(contains(text, "\"reason\": \"asked by the test\"")) << text;
}

// SIGUSR1 makes the process dump, from a thread: the handler only writes to a pipe.
TEST(FlightRecorder, Sigusr1Dumps) {
  auto pg = make_group(ProcessGroupOptions{});  // a recorder installs the handler
  struct sigaction current {};
  ::sigaction(SIGUSR1, nullptr, &current);
  if (current.sa_handler == SIG_DFL || current.sa_handler == SIG_IGN) {
    GTEST_SKIP() << "the program had its own SIGUSR1 disposition";
  }
  ScratchDir dir;
  set_flight_recorder_dir(dir.path.string());
  ::raise(SIGUSR1);
  const fs::path file = dir.path / ("rank" + std::to_string(pg->global_rank()) + ".json");
  for (int i = 0; i < 200 && !fs::exists(file); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(fs::exists(file));
  std::ifstream in(file);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(contains(text, "\"reason\": \"SIGUSR1\"")) << text;
}

#if EMBER_WITH_CUDA
// NCCL at world size 1 (a GPU; skipped without one): its collectives are recorded as issued
// and started at once, and completed when the watchdog sees their event; with debug mode the
// fingerprint check (one rank: nothing to disagree with) runs through the same function.
TEST(FlightRecorder, NcclRecordsAWorldOfOne) {
  EMBER_REQUIRE_CUDA();
  ProcessGroupOptions options;
  options.debug = true;
  NcclProcessGroup pg(0, 1, 0, 0, NcclProcessGroup::create_unique_id(), options);
  ScratchDir dir;
  set_flight_recorder_dir(dir.path.string());
  Tensor t = ones({256}, cuda_device(0));
  {
    const CollectiveTag tag("nccl step");
    pg.allreduce(t)->wait(std::chrono::seconds(30));
  }
  pg.barrier()->wait();
  std::string report;
  for (int i = 0; i < 100; ++i) {  // the watchdog looks every 20 ms
    dump_flight_recorder("asked by the test");
    report = analyze_flight_dumps(dir.path.string());
    if (contains(report, "nccl group of ranks [0]: every rank that dumped completed barrier #2")) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(
      contains(report, "nccl group of ranks [0]: every rank that dumped completed barrier #2"))
      << report;
  ::ember::testing::expect_close(t.cpu(), ones({256}));
}
#endif

// One dump by hand: rank `rank` of a tcp group of ranks 0..2, with `entries` (JSON objects).
std::string dump_of(int rank, const std::string& entries, int64_t now_ns = 10'000'000'000) {
  return R"({"ember_flight_recorder": 1, "rank": )" + std::to_string(rank) +
         R"(, "steady_now_ns": )" + std::to_string(now_ns) +
         R"(, "reason": "test", "groups": [{"backend": "tcp", "rank": )" + std::to_string(rank) +
         R"(, "size": 3, "global_ranks": [0, 1, 2], "index": 0, "broken": "", "entries": [)" +
         entries + "]}]}";
}

std::string entry(int64_t seq, const std::string& op, int64_t numel, const std::string& state,
                  const std::string& tag = "", int64_t started_ns = 8'000'000'000,
                  int64_t ended_ns = 0) {
  return R"({"seq": )" + std::to_string(seq) + R"(, "op": ")" + op + R"(", "dtype": "f32", )" +
         R"("numel": )" + std::to_string(numel) + R"(, "bytes": )" + std::to_string(numel * 4) +
         R"(, "root": -1, "reduce": "sum", "state": ")" + state +
         R"(", "enqueued_ns": 1, "started_ns": )" + std::to_string(started_ns) +
         R"(, "ended_ns": )" + std::to_string(ended_ns) + R"(, "tag": ")" + tag +
         R"(", "call_site": ""})";
}

TEST(FlightAnalyzer, NamesTheFirstDisagreementAndWhoNeverCame) {
  ScratchDir dir;
  const std::string done =
      entry(7, "allreduce", 1024, "completed", "DDP bucket 0", 1, 9'000'000'000);
  dir.write("rank0.json",
            dump_of(0, done + "," + entry(8, "barrier", 0, "started", "save_checkpoint")));
  dir.write("rank1.json",
            dump_of(1, done + "," + entry(8, "allreduce", 524288, "started", "DDP bucket 0")));
  const std::string report = analyze_flight_dumps(dir.path.string());
  EXPECT_TRUE(contains(report,
                       "tcp group of ranks [0, 1, 2]: every rank that dumped completed allreduce "
                       "#7 (DDP bucket 0, f32 x 1024, 4.0 KiB) (the last collective all "
                       "completed). The ranks disagree at #8: "))
      << report;
  EXPECT_TRUE(contains(report, "rank 1 issued allreduce #8 (DDP bucket 0, f32 x 524288, 2.0 MiB)"))
      << report;
  EXPECT_TRUE(contains(report, "rank 0 issued barrier #8 (save_checkpoint, f32 x 0, 0 B)"))
      << report;
  EXPECT_TRUE(contains(report,
                       "rank 0 waits in barrier #8 (save_checkpoint, f32 x 0, 0 B) since "
                       "2.0 s"))
      << report;
  EXPECT_TRUE(contains(report, "rank 2 left no dump")) << report;

  // A rank that never issued #8: busy in its own code.
  dir.write("rank2.json", dump_of(2, done));
  const std::string again = analyze_flight_dumps(dir.path.string());
  EXPECT_TRUE(contains(again, "rank 2 never issued #8")) << again;
  EXPECT_TRUE(contains(again,
                       "rank 2 is outside any collective: its last, allreduce #7 (DDP "
                       "bucket 0, f32 x 1024, 4.0 KiB), completed 1.0 s before its dump"))
      << again;
  EXPECT_FALSE(contains(again, "left no dump")) << again;
}

// Dumps are untrusted: anything that is not one is refused by name, with what is wrong.
TEST(FlightAnalyzer, RefusesWhatIsNoDump) {
  ScratchDir dir;
  EXPECT_EMBER_ERROR(analyze_flight_dumps(dir.path.string()), "holds no flight-recorder dump");
  EXPECT_EMBER_ERROR(analyze_flight_dumps((dir.path / "missing").string()), "is not a folder");
  auto refused = [&](const std::string& text, const std::string& why) {
    dir.write("rank0.json", text);
    EXPECT_EMBER_ERROR(analyze_flight_dumps(dir.path.string()), why);
  };
  refused("{not json", "rank0.json is no ember flight-recorder dump: not JSON");
  refused("[1, 2]", "\"ember_flight_recorder\"");
  refused(R"({"ember_flight_recorder": 2})", "\"ember_flight_recorder\" is 2, outside [1, 1]");
  refused(dump_of(0, entry(1, "allreduce", 4, "stuck")), "an entry's \"state\" is \"stuck\"");
  refused(
      dump_of(0, entry(2, "allreduce", 4, "completed") + "," + entry(2, "barrier", 0, "started")),
      "entries are not in increasing order of \"seq\"");
  refused(dump_of(0, entry(-3, "allreduce", 4, "completed")), "\"seq\" is -3");
  refused(dump_of(0, entry(1, "allreduce", 4, "completed", std::string(300, 'x'))),
          "\"tag\" is longer than 256 bytes");
  refused(dump_of(1, "").replace(dump_of(1, "").find("\"rank\": 1,"), 10, "\"rank\": 0,"),
          "its group rank 1 is not the writer's rank 0");
  // Too large to read: refused by its size, unread.
  fs::remove(dir.path / "rank0.json");
  { std::ofstream(dir.path / "rank0.json") << " "; }
  fs::resize_file(dir.path / "rank0.json", (uintmax_t{64} << 20) + 1);
  EXPECT_EMBER_ERROR(analyze_flight_dumps(dir.path.string()), "more than 64 MiB");
}

// A rank whose group broke gathers its peers' answers over the store into its own folder;
// what the store holds is untrusted: only a dump of the rank it is filed under is written.
TEST(FlightGather, WritesEachPeersDumpAndRefusesWhatIsNoDumpOfThatRank) {
  using namespace std::chrono_literals;
  ScratchDir dir;
  set_flight_recorder_dir(dir.path.string());
  TcpStore server("127.0.0.1", 0, 1, /*is_server=*/true, 10s);
  auto store = std::make_shared<TcpStore>("127.0.0.1", server.port(), 1, false, 10s);
  const std::string good = R"({"ember_flight_recorder": 1, "rank": 1, "groups": []})";
  const std::string planted[] = {good, R"({"ember_flight_recorder": 1, "rank": 1})", "{not json",
                                 ""};
  for (int r = 1; r <= 4; ++r) {  // ranks 1 to 4 answered request #1; rank 5 never answers
    store->set("t/dump/" + std::to_string(r), planted[r - 1]);
    store->add("t/answered/" + std::to_string(r), 1);
  }
  detail::StoreFlightDumps asker(store, "t/", 0, 6, "asked");
  const auto start = std::chrono::steady_clock::now();
  asker.request(500ms);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);  // the silent rank is not awaited
  std::string text;
  {
    std::ifstream in(dir.path / "rank1.json");
    std::getline(in, text, '\0');
  }
  EXPECT_EQ(text, good);
  for (int r = 2; r <= 5; ++r)
    EXPECT_FALSE(fs::exists(dir.path / ("rank" + std::to_string(r) + ".json"))) << r;
  EXPECT_EQ(store->add("t/requests", 0), 1);
  // The asker's own dump went out too, as its answer to every request, later ones included.
  EXPECT_GE(store->add("t/answered/0", 0), int64_t{1} << 40);
  // Once rank 5's process ends (leave), it is not awaited, however long the asker would wait.
  detail::StoreFlightDumps(store, "t/", 5, 6, "asked").leave();
  for (int r = 1; r <= 4; ++r) store->add("t/answered/" + std::to_string(r), 1);
  const auto again = std::chrono::steady_clock::now();
  asker.request(60s);
  EXPECT_LT(std::chrono::steady_clock::now() - again, 5s);
  EXPECT_THROW(detail::StoreFlightDumps(nullptr, "t/", 0, 2, "asked"), Error);
  EXPECT_THROW(detail::StoreFlightDumps(store, "t/", 2, 2, "asked"), Error);
}

}  // namespace
}  // namespace ember::dist

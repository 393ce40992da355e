// ember-train --trace on 2 ranks (TCP, torchrun-style): the merged Chrome trace parses, each
// rank has one forward and one backward per module of named_modules(), one all-reduce per DDP
// bucket adding up to the gradient bytes and one optimizer step in every traced step, and the
// printed overlap figures are what the trace's own events give.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "test_util.h"
#include "train_cli.h"

namespace ember::apps {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::Result;

struct Interval {
  double start, end;
};

double overlap(Interval a, Interval b) {
  return std::max(0.0, std::min(a.end, b.end) - std::max(a.start, b.start));
}

// The share of all-reduce time inside backward passes before DDP's wait, and the wait per
// step, recomputed from one rank's events (microseconds).
std::pair<double, double> hidden_and_wait(const std::vector<json>& events) {
  std::vector<Interval> passes, waits, buckets;
  int steps = 0;
  for (const json& e : events) {
    const Interval i{e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>()};
    const std::string cat = e["cat"];
    if (cat == "autograd") passes.push_back(i);
    if (cat == "wait") waits.push_back(i);
    if (cat == "comm") buckets.push_back(i);
    if (cat == "step") ++steps;
  }
  double hidden = 0, total = 0, waited = 0;
  for (const Interval& w : waits) waited += w.end - w.start;
  for (Interval p : passes) {
    for (const Interval& w : waits)
      if (w.start >= p.start && w.start <= p.end) p.end = std::min(p.end, w.start);
    for (const Interval& b : buckets) hidden += overlap(b, p);
  }
  for (const Interval& b : buckets) total += b.end - b.start;
  return {100 * hidden / total, waited / 1e3 / steps};
}

TEST(TraceTrain, TwoRanksTraceEveryModuleBucketAndOptimizerStep) {
  const fs::path root = fs::temp_directory_path() / ("ember-trace-" + std::to_string(::getpid()));
  fs::remove_all(root);
  ASSERT_TRUE(testing::make_image_folder(root / "data", 20, 2));
  const fs::path trace_path = root / "trace.json";
  const std::string command =
      std::string("TORCHRUN_STYLE_TIMEOUT=120 bash ") + EMBER_TORCHRUN_STYLE + " 2 " +
      EMBER_TRAIN_BIN + " --dataset folder --data " + (root / "data").string() +
      " --image-size 16 --mean 0.5 0.5 0.5 --std 0.25 0.25 0.25 --batch-size 4 --epochs 1"
      " --max-steps 5 --workers 0 --threads 1 --device cpu --out-dir " +
      (root / "out").string() + " --trace " + trace_path.string() +
      " --trace-start 2 --trace-end 4";
  const Result r = testing::run(command);
  ASSERT_EQ(r.code, 0) << r.output;

  std::ifstream in(trace_path);
  ASSERT_TRUE(in.good()) << "no trace at " << trace_path << "\n" << r.output;
  const json trace = json::parse(in);
  std::map<int, std::vector<json>> by_rank;  // the "X" events of each pid
  std::map<int, std::set<std::string>> rows;
  for (const json& e : trace.at("traceEvents")) {
    if (e.at("ph") == "X") by_rank[e.at("pid").get<int>()].push_back(e);
    // What Perfetto needs beside chrome://tracing: no event before the origin, no tid 0.
    if (e.at("ph") == "X") {
      EXPECT_GE(e.at("ts").get<double>(), 0.0) << e;
    }
    if (e.at("ph") != "M" || e.at("name") == "thread_name") {
      EXPECT_GT(e.at("tid").get<int>(), 0) << e;
    }
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      rows[e.at("pid").get<int>()].insert(e.at("args").at("name").get<std::string>());
  }
  ASSERT_EQ(by_rank.size(), 2u);

  // The model ember-train built: named_modules() and the gradient bytes.
  const auto model = nn::resnet("resnet20", 2, 3);
  std::multiset<std::string> modules;
  for (const auto& [name, m] : model->named_modules()) modules.insert(name);
  int64_t gradient_bytes = 0;
  for (const Tensor& p : model->parameters()) gradient_bytes += static_cast<int64_t>(p.nbytes());

  for (auto& [rank, events] : by_rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_TRUE(rows[rank].count("main") && rows[rank].count("DDP all-reduce"));
    std::map<int64_t, std::multiset<std::string>> forward, backward;
    std::map<int64_t, int64_t> bucket_bytes, optimizer_steps, steps, buckets;
    for (const json& e : events) {
      const std::string cat = e.at("cat");
      const int64_t step = e.at("args").at("step");
      EXPECT_TRUE(step == 2 || step == 3) << e;
      if (cat == "forward") forward[step].insert(e.at("args").at("module").get<std::string>());
      if (cat == "backward") backward[step].insert(e.at("args").at("module").get<std::string>());
      if (cat == "comm") {
        bucket_bytes[step] += e.at("args").at("bytes").get<int64_t>();
        ++buckets[step];
      }
      if (cat == "optimizer") ++optimizer_steps[step];
      if (cat == "step") ++steps[step];
    }
    for (int64_t step : {2, 3}) {
      SCOPED_TRACE("step " + std::to_string(step));
      EXPECT_EQ(forward[step], modules);
      EXPECT_EQ(backward[step], modules);
      EXPECT_GE(buckets[step], 1);
      EXPECT_EQ(bucket_bytes[step], gradient_bytes);
      EXPECT_EQ(optimizer_steps[step], 1);
      EXPECT_EQ(steps[step], 1);
    }
    EXPECT_EQ(buckets[2], buckets[3]);
    // DDP waits after the backward graph, as PyTorch's reducer does: never inside an op's
    // event (the last AccumulateGrad's, whose hook issued the last bucket).
    for (const json& wait : events) {
      if (wait.at("name") != "DDP wait for all-reduce") continue;
      const double begin = wait.at("ts"), end = begin + wait.at("dur").get<double>();
      for (const json& op : events) {
        if (op.at("cat") != "op" || op.at("tid") != wait.at("tid")) continue;
        const double op_begin = op.at("ts"), op_end = op_begin + op.at("dur").get<double>();
        EXPECT_FALSE(op_begin <= begin && end <= op_end) << op << " holds " << wait;
      }
    }

    // The printed figures equal the trace's own, within a point (and the wait within the
    // printed rounding and the trace's microsecond ticks).
    const auto [hidden, wait_ms] = hidden_and_wait(events);
    const std::regex line(
        "overlap: rank " + std::to_string(rank) +
        R"(: ([0-9.]+)% of all-reduce time hidden behind backward \([0-9.]+ ms per step\); the optimizer waited ([0-9.]+) ms per step)");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, line)) << r.output;
    EXPECT_NEAR(std::stod(m[1]), hidden, 1.0) << r.output;
    EXPECT_NEAR(std::stod(m[2]), wait_ms, 0.02) << r.output;
  }
  EXPECT_TRUE(std::regex_search(r.output, std::regex(R"(overlap: slowest rank: [01] \(busy )")))
      << r.output;
  fs::remove_all(root);
}

// One process: a window the run ends inside holds the steps that ran; one after the run's
// end writes nothing and says so.
TEST(TraceTrain, WindowCutShortByTheRunsEndAndWindowNeverReached) {
  const fs::path root = fs::temp_directory_path() / ("ember-trace1-" + std::to_string(::getpid()));
  fs::remove_all(root);
  ASSERT_TRUE(testing::make_image_folder(root / "data", 8, 2));
  const std::string command = std::string(EMBER_TRAIN_BIN) + " --dataset folder --data " +
                              (root / "data").string() +
                              " --image-size 16 --mean 0.5 0.5 0.5 --std 0.25 0.25 0.25"
                              " --batch-size 4 --epochs 1 --max-steps 3 --workers 0 --threads 1"
                              " --device cpu --out-dir " +
                              (root / "out").string() + " --trace " + (root / "t.json").string();
  const Result cut = testing::run(command + " --trace-start 2 --trace-end 10");
  ASSERT_EQ(cut.code, 0) << cut.output;
  EXPECT_NE(cut.output.find("trace of 1 step(s) on 1 rank(s)"), std::string::npos) << cut.output;
  EXPECT_NE(cut.output.find("overlap: rank 0: no all-reduce traced"), std::string::npos)
      << cut.output;
  std::ifstream in(root / "t.json");
  const json trace = json::parse(in);
  std::set<int64_t> steps;
  for (const json& e : trace.at("traceEvents"))
    if (e.at("ph") == "X") steps.insert(e.at("args").at("step").get<int64_t>());
  EXPECT_EQ(steps, std::set<int64_t>{2});
  fs::remove(root / "t.json");

  const Result never = testing::run(command);  // steps 10 to 20 of a 3-step run
  ASSERT_EQ(never.code, 0) << never.output;
  EXPECT_NE(never.output.find("ember-train: --trace: the run ended at step 3, before step 10 "
                              "where the traced window starts; no trace written"),
            std::string::npos)
      << never.output;
  EXPECT_FALSE(fs::exists(root / "t.json"));
  fs::remove_all(root);
}

TEST(TraceTrain, TraceWindowMustEndAfterItStarts) {
  TrainOptions o;
  EXPECT_EQ(testing::parse_args({"--trace", "t.json", "--trace-start", "5", "--trace-end", "5"}, o),
            2);
  TrainOptions defaults;
  ASSERT_EQ(testing::parse_args({"--trace", "t.json"}, defaults), -1);
  EXPECT_EQ(defaults.trace, "t.json");
  EXPECT_EQ(defaults.trace_start, 10);
  EXPECT_EQ(defaults.trace_end, 20);
}

}  // namespace
}  // namespace ember::apps

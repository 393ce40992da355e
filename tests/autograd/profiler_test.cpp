// The profiler (torch.profiler's shape) and the trace recorder under it: the schedule's
// actions, which steps a window holds, forward and backward per module, record_function, and
// the Chrome Trace Event JSON (parsed back, names with quotes, control bytes and bad UTF-8).
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember {
namespace {

using profiler::ProfilerAction;

TEST(ProfilerSchedule, FollowsTorchProfilerSchedule) {
  // torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1, skip_first=1) over 8 steps.
  const auto s = profiler::schedule(1, 1, 2, 1, 1);
  const std::vector<ProfilerAction> expected = {
      ProfilerAction::kNone,   ProfilerAction::kNone,          ProfilerAction::kWarmup,
      ProfilerAction::kRecord, ProfilerAction::kRecordAndSave, ProfilerAction::kNone,
      ProfilerAction::kNone,   ProfilerAction::kNone};
  for (int64_t step = 0; step < 8; ++step) EXPECT_EQ(s(step), expected[step]) << "step " << step;
  // repeat = 0 cycles for as long as steps come.
  const auto cycling = profiler::schedule(1, 0, 1);
  for (int64_t step = 0; step < 10; ++step)
    EXPECT_EQ(cycling(step),
              step % 2 == 0 ? ProfilerAction::kNone : ProfilerAction::kRecordAndSave);
}

TEST(ProfilerSchedule, RefusesImpossibleCounts) {
  EXPECT_EMBER_ERROR(profiler::schedule(0, 0, 0), "active must be >= 1, got 0");
  EXPECT_EMBER_ERROR(profiler::schedule(-1, 0, 1), "wait=-1");
}

struct TwoLayers {
  std::shared_ptr<nn::Sequential> model =
      std::make_shared<nn::Sequential>(std::initializer_list<std::shared_ptr<nn::Module>>{
          std::make_shared<nn::Linear>(3, 4), std::make_shared<nn::ReLU>(),
          std::make_shared<nn::Linear>(4, 2)});
  void step() {
    model->zero_grad();
    (*model)(ones({5, 3})).sum().backward();
  }
};

std::vector<trace::Event> of(const std::vector<trace::Event>& events, trace::Category c) {
  std::vector<trace::Event> out;
  for (const auto& e : events)
    if (e.category == c) out.push_back(e);
  return out;
}

TEST(Profiler, RecordsOnlyTheActiveStepsOfEachWindow) {
  TwoLayers net;
  std::vector<std::vector<int64_t>> windows;  // the steps of each finished window
  profiler::Profiler prof(
      {.schedule = profiler::schedule(1, 1, 2, 2), .on_trace_ready = [&](profiler::Profiler& p) {
         windows.emplace_back();
         for (const auto& e : of(p.events(), trace::Category::kStep))
           windows.back().push_back(e.step);
       }});
  prof.start();
  for (int i = 0; i < 9; ++i) {
    net.step();
    prof.step();
  }
  prof.stop();
  // Cycles of 4: wait 0, warm-up 1, record 2-3; wait 4, warm-up 5, record 6-7; then nothing.
  EXPECT_EQ(windows, (std::vector<std::vector<int64_t>>{{2, 3}, {6, 7}}));
  // The last window's events all belong to its steps (the warm-up's were thrown away).
  for (const auto& e : prof.events()) EXPECT_TRUE(e.step == 6 || e.step == 7) << e.name;
  EXPECT_EQ(of(prof.events(), trace::Category::kStep)[0].name, "ProfilerStep#6");
  EXPECT_FALSE(trace::enabled());
}

TEST(Profiler, AResumedLoopCountsItsOwnSteps) {
  TwoLayers net;
  profiler::Profiler prof({.schedule = profiler::schedule(6, 0, 2, 1)});
  prof.start(5);  // a loop resumed at step 5: steps 6 and 7 are recorded
  for (int i = 0; i < 4; ++i) {
    net.step();
    prof.step();
  }
  prof.stop();
  std::vector<std::string> steps;
  for (const auto& e : of(prof.events(), trace::Category::kStep)) steps.push_back(e.name);
  EXPECT_EQ(steps, (std::vector<std::string>{"ProfilerStep#6", "ProfilerStep#7"}));
  EXPECT_EQ(prof.step_num(), 9);
  EXPECT_EMBER_ERROR(profiler::Profiler().start(-1), "first_step must be >= 0, got -1");
}

TEST(Profiler, TimesForwardAndBackwardOfEveryModuleOncePerStep) {
  TwoLayers net;
  profiler::Profiler prof;
  prof.start();
  for (int i = 0; i < 2; ++i) {
    profiler::RecordFunction range("my_step");
    net.step();
    prof.step();
  }
  prof.stop();
  const auto& events = prof.events();
  std::map<std::string, int> forward, backward;
  for (const auto& e : of(events, trace::Category::kForward)) ++forward[e.path];
  for (const auto& e : of(events, trace::Category::kBackward)) ++backward[e.path];
  // named_modules(): "" (the Sequential), "0", "1" (ReLU), "2"; two steps each. ReLU's
  // backward node is its own, so it is timed too.
  const std::map<std::string, int> twice = {{"", 2}, {"0", 2}, {"1", 2}, {"2", 2}};
  EXPECT_EQ(forward, twice);
  EXPECT_EQ(backward, twice);
  // The root's backward spans its children's; the last layer's backward runs before the first's.
  std::map<std::string, trace::Event> first_backward;
  for (const auto& e : of(events, trace::Category::kBackward))
    if (e.step == 0) first_backward.emplace(e.path, e);
  const auto& root = first_backward.at("");
  for (const char* child : {"0", "1", "2"}) {
    const auto& c = first_backward.at(child);
    EXPECT_LE(root.start_ns, c.start_ns);
    EXPECT_GE(root.start_ns + root.dur_ns, c.start_ns + c.dur_ns);
  }
  EXPECT_LE(first_backward.at("2").start_ns, first_backward.at("0").start_ns);
  EXPECT_EQ(first_backward.at("0").type, "Linear");
  EXPECT_EQ(first_backward.at("").name, "Sequential");
  EXPECT_EQ(of(events, trace::Category::kUser).size(), 2u);
  EXPECT_EQ(of(events, trace::Category::kAutograd).size(), 2u);
  EXPECT_FALSE(of(events, trace::Category::kOp).empty());
}

TEST(Profiler, CallingForwardDirectlyIsNotTimedAsInPyTorch) {
  TwoLayers net;
  profiler::Profiler prof;
  prof.start();
  net.model->forward(ones({5, 3}));  // the Sequential itself untimed; its children are called
  prof.stop();
  std::map<std::string, int> forward;
  for (const auto& e : of(prof.events(), trace::Category::kForward)) ++forward[e.name];
  // Without a timed parent each child is a root of its own, named by its type.
  EXPECT_EQ(forward, (std::map<std::string, int>{{"Linear", 2}, {"ReLU", 1}}));
}

TEST(Profiler, OneRecordingAtATime) {
  profiler::Profiler a, b;
  a.start();
  EXPECT_EMBER_ERROR(b.start(), "a trace is being recorded already");
  a.stop();
  b.start();
  b.stop();
  EXPECT_EMBER_ERROR(b.step(), "start() the profiler first");
}

// On a GPU: a range given a CUDA device also records the device-side interval between CUDA
// events on its stream, on that stream's row, placed on the host clock.
TEST(Profiler, DeviceIntervalsComeFromCudaEventsOnTheirStreamsRow) {
  EMBER_REQUIRE_CUDA();
  const Device gpu(DeviceType::kCUDA, 0);
  const Tensor a = ones({512, 512}, TensorOptions(kF32, gpu));
  profiler::Profiler prof;
  prof.start();
  const int64_t issued = trace::now_ns();
  {
    const trace::Range range(trace::Category::kUser, "matmuls", gpu);
    for (int i = 0; i < 20; ++i) (void)matmul(a, a);
  }
  prof.stop();
  const auto device = of(prof.events(), trace::Category::kDevice);
  ASSERT_EQ(device.size(), 1u);
  EXPECT_EQ(device[0].name, "matmuls");
  EXPECT_GT(device[0].dur_ns, 0);
  // Device work ends after the host issued it (1 ms for the clocks' alignment).
  EXPECT_GE(device[0].start_ns + device[0].dur_ns, issued - 1000000);
  std::string row;
  for (const auto& [id, name] : trace::row_names())
    if (id == device[0].row) row = name;
  EXPECT_EQ(row.rfind("cuda:0 stream ", 0), 0u) << row;
}

TEST(TraceJson, EscapesNamesAndKeepsUtf8) {
  EXPECT_EQ(trace::json_string("plain"), "\"plain\"");
  EXPECT_EQ(trace::json_string("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(trace::json_string("line\nnext\ttab\r"), "\"line\\nnext\\ttab\\r\"");
  EXPECT_EQ(trace::json_string(std::string("nul\0bell\x07", 9)), "\"nul\\u0000bell\\u0007\"");
  EXPECT_EQ(trace::json_string("caf\xC3\xA9 \xE2\x82\xAC"), "\"caf\xC3\xA9 \xE2\x82\xAC\"");
  // Not UTF-8 (a lone continuation byte, a truncated sequence, an overlong '/'): replaced.
  EXPECT_EQ(trace::json_string("a\x80z\xC3"), "\"a\\ufffdz\\ufffd\"");
  EXPECT_EQ(trace::json_string("\xC0\xAF"), "\"\\ufffd\\ufffd\"");
}

TEST(TraceJson, ExportedTraceParsesWithEveryFieldPerfettoReads) {
  profiler::Profiler prof;
  prof.start();
  {
    profiler::RecordFunction r("name \"quoted\"\n\x01 caf\xC3\xA9 \xFF");
    TwoLayers().step();
  }
  prof.stop();
  const auto path = std::filesystem::temp_directory_path() /
                    ("ember-profiler-" + std::to_string(::getpid()) + ".json");
  prof.export_chrome_trace(path.string());
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::filesystem::remove(path);
  ASSERT_TRUE(trace.contains("traceEvents"));
  int complete = 0, named_rows = 0;
  bool found = false;
  for (const auto& e : trace["traceEvents"]) {
    const std::string ph = e.at("ph");
    ASSERT_TRUE(ph == "X" || ph == "M") << e;
    EXPECT_EQ(e.at("pid"), 0);
    EXPECT_TRUE(e.at("tid").is_number_integer()) << e;
    if (ph == "M") {
      named_rows += e.at("name") == "thread_name";
      continue;
    }
    ++complete;
    EXPECT_GE(e.at("ts").get<double>(), 0.0) << e;
    EXPECT_GE(e.at("dur").get<double>(), 0.0) << e;
    found = found || e.at("name") == "name \"quoted\"\n\x01 caf\xC3\xA9 \xEF\xBF\xBD";
  }
  EXPECT_EQ(complete, static_cast<int>(prof.events().size()));
  EXPECT_GE(named_rows, 1);
  EXPECT_TRUE(found) << "the record_function range's name does not read back";
}

TEST(TraceJson, ExportNamesAPathItCannotWrite) {
  profiler::Profiler prof;
  prof.start();
  prof.stop();
  EXPECT_EMBER_ERROR(prof.export_chrome_trace("/nonexistent-dir/trace.json"),
                     "export_chrome_trace: cannot write /nonexistent-dir/trace.json");
}

}  // namespace
}  // namespace ember

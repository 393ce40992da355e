// A profiler shaped like torch.profiler's: a schedule of steps, step(), record_function ranges
// and export_chrome_trace, writing Chrome Trace Event JSON (open it in https://ui.perfetto.dev
// or chrome://tracing).
//
//   profiler::Profiler prof({.schedule = profiler::schedule(/*wait=*/1, /*warmup=*/1,
//                                                          /*active=*/3)});
//   prof.start();
//   for (auto& batch : loader) {
//     { profiler::RecordFunction r("my_step"); train_step(batch); }
//     prof.step();
//   }
//   prof.stop();
//   prof.export_chrome_trace("trace.json");
//
// What is recorded: modules called as module(x) (forward per module, and backward per module
// from the autograd nodes made in its forward), every backward node, record_function ranges,
// DDP's bucket all-reduces and its wait for them, and one ProfilerStep#N range per step.
// One profiler records at a time (the recorder is process-wide).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ember/tensor/trace.h>

namespace ember::profiler {

// torch.profiler.ProfilerAction.
enum class ProfilerAction { kNone, kWarmup, kRecord, kRecordAndSave };

// torch.profiler.schedule: skip_first steps, then cycles of `wait` idle steps, `warmup` steps
// recorded and thrown away, and `active` steps recorded (the last of them kRecordAndSave);
// `repeat` cycles (0: for as long as steps come). ember::Error when active < 1 or a count is
// negative.
struct Schedule {
  int64_t wait = 0, warmup = 0, active = 1, repeat = 0, skip_first = 0;
  ProfilerAction operator()(int64_t step) const;
};
Schedule schedule(int64_t wait, int64_t warmup, int64_t active, int64_t repeat = 0,
                  int64_t skip_first = 0);

class Profiler;

struct ProfilerOptions {
  // None: every step from start() to stop() is recorded.
  std::optional<Schedule> schedule{};
  // Called when a window of active steps ends (and at stop() during one), as torch's
  // on_trace_ready; the window's events are then in events().
  std::function<void(Profiler&)> on_trace_ready{};
};

class Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {});
  ~Profiler();  // stops a recording still running, without calling on_trace_ready
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Begins at step `first_step` (torch's step_num: a loop resumed at step S passes S, so the
  // schedule and ProfilerStep#N count the loop's own steps); ember::Error if another profiler
  // records.
  void start(int64_t first_step = 0);
  // Ends the current step and begins the next, following the schedule.
  void step();
  // Ends profiling; a window being recorded is finished (on_trace_ready called).
  void stop();
  int64_t step_num() const { return step_; }

  // The last finished window's events (host clock, trace::now_ns).
  const std::vector<trace::Event>& events() const { return events_; }
  // Writes them as Chrome Trace Event JSON (pid 0); ember::Error naming the path if it cannot
  // be written.
  void export_chrome_trace(const std::string& path) const;

 private:
  ProfilerAction action(int64_t step) const;
  void enter(ProfilerAction previous, ProfilerAction next);
  void finish_window();

  ProfilerOptions options_;
  bool running_ = false, recording_ = false;
  int64_t step_ = 0;
  int64_t step_start_ns_ = 0;
  std::vector<trace::Event> events_;
};

// torch.profiler.record_function: a named range on the calling thread's row while it lives.
class RecordFunction {
 public:
  explicit RecordFunction(std::string name) : range_(trace::Category::kUser, std::move(name)) {}

 private:
  trace::Range range_;
};

}  // namespace ember::profiler

#include "profiler.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <ember/tensor/error.h>

namespace ember::profiler {

namespace {
bool records(ProfilerAction a) {
  return a == ProfilerAction::kRecord || a == ProfilerAction::kRecordAndSave;
}
}  // namespace

ProfilerAction Schedule::operator()(int64_t step) const {
  if (step < skip_first) return ProfilerAction::kNone;
  step -= skip_first;
  const int64_t cycle = wait + warmup + active;
  if (repeat > 0 && step / cycle >= repeat) return ProfilerAction::kNone;
  const int64_t at = step % cycle;
  if (at < wait) return ProfilerAction::kNone;
  if (at < wait + warmup) return ProfilerAction::kWarmup;
  return at < cycle - 1 ? ProfilerAction::kRecord : ProfilerAction::kRecordAndSave;
}

Schedule schedule(int64_t wait, int64_t warmup, int64_t active, int64_t repeat,
                  int64_t skip_first) {
  EMBER_CHECK(wait >= 0 && warmup >= 0 && repeat >= 0 && skip_first >= 0, "profiler::schedule",
              "wait, warmup, repeat and skip_first must be >= 0, got wait=", wait,
              " warmup=", warmup, " repeat=", repeat, " skip_first=", skip_first);
  EMBER_CHECK(active >= 1, "profiler::schedule", "active must be >= 1, got ", active);
  return {wait, warmup, active, repeat, skip_first};
}

Profiler::Profiler(ProfilerOptions options) : options_(std::move(options)) {}

Profiler::~Profiler() {
  if (recording_) trace::stop();
}

ProfilerAction Profiler::action(int64_t step) const {
  return options_.schedule ? (*options_.schedule)(step) : ProfilerAction::kRecord;
}

void Profiler::start(int64_t first_step) {
  EMBER_CHECK(!running_, "Profiler::start", "the profiler is running already");
  EMBER_CHECK(first_step >= 0, "Profiler::start", "first_step must be >= 0, got ", first_step);
  step_ = first_step;
  events_.clear();
  if (action(step_) != ProfilerAction::kNone) {
    trace::start();
    recording_ = true;
  }
  running_ = true;
  trace::set_step(step_);
  step_start_ns_ = trace::now_ns();
}

void Profiler::finish_window() {
  events_ = trace::stop();
  recording_ = false;
  std::sort(events_.begin(), events_.end(),
            [](const trace::Event& a, const trace::Event& b) { return a.start_ns < b.start_ns; });
  if (options_.on_trace_ready) options_.on_trace_ready(*this);
}

void Profiler::enter(ProfilerAction previous, ProfilerAction next) {
  if (previous == ProfilerAction::kRecordAndSave) finish_window();
  if (next == ProfilerAction::kNone) {
    if (recording_) trace::stop();  // a warm-up cut short: nothing to keep
    recording_ = false;
  } else if (!recording_) {
    trace::start();
    recording_ = true;
  } else if (previous == ProfilerAction::kWarmup && records(next)) {
    trace::discard();
  }
}

void Profiler::step() {
  EMBER_CHECK(running_, "Profiler::step", "start() the profiler first");
  const ProfilerAction previous = action(step_);
  if (records(previous))
    trace::record(trace::Category::kStep, "ProfilerStep#" + std::to_string(step_), step_start_ns_,
                  trace::now_ns());
  ++step_;
  enter(previous, action(step_));
  trace::set_step(step_);
  step_start_ns_ = trace::now_ns();
}

void Profiler::stop() {
  if (!running_) return;
  running_ = false;
  if (!recording_) return;
  if (records(action(step_))) {
    trace::record(trace::Category::kStep, "ProfilerStep#" + std::to_string(step_), step_start_ns_,
                  trace::now_ns());
    finish_window();
  } else {
    trace::stop();
    recording_ = false;
  }
}

void Profiler::export_chrome_trace(const std::string& path) const {
  int64_t origin = 0;
  if (!events_.empty()) origin = events_.front().start_ns;
  for (const trace::Event& e : events_) origin = std::min(origin, e.start_ns);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  EMBER_CHECK(out.good(), "export_chrome_trace", "cannot write ", path, ": ", std::strerror(errno));
  trace::write_chrome_trace(out, {trace::chrome_trace_events(events_, 0, origin)});
  out.flush();
  EMBER_CHECK(out.good(), "export_chrome_trace", "writing ", path,
              " failed: ", std::strerror(errno));
}

}  // namespace ember::profiler

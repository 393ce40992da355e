#include "trace.h"

#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <ostream>
#include <unordered_map>

#include <ember/config.h>
#include <ember/tensor/cuda.h>
#include <ember/tensor/error.h>

#if EMBER_WITH_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace ember::trace {

namespace detail {
std::atomic<bool> recording{false};
}  // namespace detail

// A device interval in flight: CUDA events on one stream, resolved when recording stops.
struct DeviceInterval {
  std::string name;
  Category category;
  int64_t step;
  int device;
  cuda::Stream stream;
  cuda::Event start{true}, end{true};
  // Set (release) once `end` is recorded; a profiler stopping on another thread reads it
  // (acquire) before it reads the event.
  std::atomic<bool> ended{false};
};

namespace {

struct ScopeInfo {
  std::string path, type;
  uint32_t parent;
};

// Per device: an event whose host time is known, the origin device intervals are placed from.
struct DeviceClock {
  cuda::Event reference{true};
  int64_t host_ns = 0;
};

struct Recorder {
  std::mutex mutex;
  std::vector<Event> events;
  std::vector<std::string> rows;
  std::map<std::string, int32_t> named;
  std::unordered_map<uint32_t, ScopeInfo> scopes;
  std::vector<std::shared_ptr<DeviceInterval>> intervals;
  std::map<int, DeviceClock> clocks;
  int64_t step = -1;
};

Recorder& recorder() {
  static Recorder* r = new Recorder();  // never destroyed: threads may record during exit
  return *r;
}

std::atomic<uint32_t> next_scope{1};
thread_local int32_t thread_row = -1;
thread_local uint32_t scope_now = 0;

int32_t add_row(Recorder& r, std::string name) {
  r.rows.push_back(std::move(name));
  return static_cast<int32_t>(r.rows.size() - 1);
}

// The calling thread's row (r.mutex held).
int32_t this_thread_row(Recorder& r) {
  if (thread_row < 0) thread_row = add_row(r, "thread " + std::to_string(r.rows.size()));
  return thread_row;
}

}  // namespace

const char* category_name(Category category) {
  switch (category) {
    case Category::kForward:
      return "forward";
    case Category::kBackward:
      return "backward";
    case Category::kOp:
      return "op";
    case Category::kAutograd:
      return "autograd";
    case Category::kComm:
      return "comm";
    case Category::kWait:
      return "wait";
    case Category::kData:
      return "data";
    case Category::kOptimizer:
      return "optimizer";
    case Category::kStep:
      return "step";
    case Category::kUser:
      return "user";
    case Category::kDevice:
      return "device";
  }
  return "user";
}

void set_thread_row_name(const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (thread_row < 0) {
    thread_row = add_row(r, name);
  } else {
    r.rows[static_cast<size_t>(thread_row)] = name;
  }
}

int32_t named_row(const std::string& name) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.named.find(name);
  if (it != r.named.end()) return it->second;
  const int32_t row = add_row(r, name);
  r.named.emplace(name, row);
  return row;
}

std::vector<std::pair<int32_t, std::string>> row_names() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::pair<int32_t, std::string>> out;
  for (size_t i = 0; i < r.rows.size(); ++i) out.emplace_back(static_cast<int32_t>(i), r.rows[i]);
  return out;
}

void start() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  EMBER_CHECK(!detail::recording.load(), "trace::start",
              "a trace is being recorded already (one profiler records at a time); stop it first");
  r.events.clear();
  r.scopes.clear();
  r.intervals.clear();
  r.clocks.clear();
  r.step = -1;
  detail::recording.store(true);
}

void discard() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.events.clear();
  r.intervals.clear();
}

std::vector<Event> stop() {
  Recorder& r = recorder();
  std::vector<std::shared_ptr<DeviceInterval>> intervals;
  std::map<int, DeviceClock> clocks;
  std::vector<Event> events;
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    detail::recording.store(false);
    events = std::move(r.events);
    r.events.clear();
    intervals = std::move(r.intervals);
    r.intervals.clear();
    clocks = std::move(r.clocks);
    r.clocks.clear();
  }
  // Device intervals: placed on the host clock from each device's reference event.
  for (const auto& d : intervals) {
    if (!d->ended.load(std::memory_order_acquire)) continue;
    d->end.synchronize();
    const DeviceClock& clock = clocks.at(d->device);
    const auto at = [&clock](const cuda::Event& e) {
      return clock.host_ns + static_cast<int64_t>(clock.reference.elapsed_ms(e) * 1e6);
    };
    Event e;
    e.name = d->name;
    e.category = Category::kDevice;
    e.start_ns = at(d->start);
    e.dur_ns = at(d->end) - e.start_ns;
    e.step = d->step;
    e.row = named_row("cuda:" + std::to_string(d->device) + " stream " +
                      std::to_string(reinterpret_cast<uintptr_t>(d->stream.handle())));
    events.push_back(std::move(e));
  }
  return events;
}

void set_step(int64_t step) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.step = step;
}

void record(Event event) {
  if (!enabled()) return;
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (!detail::recording.load(std::memory_order_relaxed)) return;
  if (event.row < 0) event.row = this_thread_row(r);
  if (event.step < 0) event.step = r.step;
  r.events.push_back(std::move(event));
}

void record(Category category, std::string name, int64_t start_ns, int64_t end_ns, int64_t bytes) {
  Event e;
  e.name = std::move(name);
  e.category = category;
  e.start_ns = start_ns;
  e.dur_ns = end_ns - start_ns;
  e.bytes = bytes;
  record(std::move(e));
}

void Range::begin(Category category, std::string name, Device device) {
  name_ = std::move(name);
  category_ = category;
#if EMBER_WITH_CUDA
  nvtxRangePushA(name_.c_str());
#endif
  if (device.is_cuda()) {
    auto d = std::make_shared<DeviceInterval>();
    d->name = name_;
    d->category = category;
    d->device = device.index;
    d->stream = cuda::current_stream(device.index);
    Recorder& r = recorder();
    {
      std::lock_guard<std::mutex> lock(r.mutex);
      d->step = r.step;
      if (r.clocks.find(device.index) == r.clocks.end()) {
        // NOTE: once per device and recording: the reference event is waited for, so its host
        // time is the moment the stream reached it (give or take the wake-up).
        DeviceClock& clock = r.clocks[device.index];
        clock.reference.record(d->stream);
        clock.reference.synchronize();
        clock.host_ns = now_ns();
      }
      r.intervals.push_back(d);
    }
    d->start.record(d->stream);
    device_ = std::move(d);
  }
  start_ns_ = now_ns();
}

void Range::end() {
  const int64_t end_ns = now_ns();
  if (device_) {
    device_->end.record(device_->stream);
    device_->ended.store(true, std::memory_order_release);
  }
#if EMBER_WITH_CUDA
  nvtxRangePop();
#endif
  record(category_, std::move(name_), start_ns_, end_ns);
}

uint32_t current_scope() { return scope_now; }

void ModuleScope::begin(std::string path, std::string type) {
  id_ = next_scope.fetch_add(1, std::memory_order_relaxed);
  parent_ = scope_now;
  {
    Recorder& r = recorder();
    std::lock_guard<std::mutex> lock(r.mutex);
    r.scopes[id_] = {path, type, parent_};
  }
  path_ = std::move(path);
  type_ = std::move(type);
  scope_now = id_;
#if EMBER_WITH_CUDA
  nvtxRangePushA(path_.empty() ? type_.c_str() : path_.c_str());
#endif
  start_ns_ = now_ns();
}

void ModuleScope::end() {
  const int64_t end_ns = now_ns();
#if EMBER_WITH_CUDA
  nvtxRangePop();
#endif
  scope_now = parent_;
  Event e;
  e.name = path_.empty() ? type_ : path_;
  e.category = Category::kForward;
  e.start_ns = start_ns_;
  e.dur_ns = end_ns - start_ns_;
  e.path = std::move(path_);
  e.type = std::move(type_);
  record(std::move(e));
}

void BackwardSpans::add(uint32_t scope, int64_t start_ns, int64_t end_ns) {
  if (scope == 0) return;
  for (auto it = spans_.rbegin(); it != spans_.rend(); ++it) {
    if (it->first != scope) continue;
    it->second.first = std::min(it->second.first, start_ns);
    it->second.second = std::max(it->second.second, end_ns);
    return;
  }
  spans_.push_back({scope, {start_ns, end_ns}});
}

void BackwardSpans::finish() {
  if (spans_.empty() || !enabled()) return;
  std::vector<Event> out;
  {
    Recorder& r = recorder();
    std::lock_guard<std::mutex> lock(r.mutex);
    // Each node's span counts for its module and every module around it.
    std::map<uint32_t, std::pair<int64_t, int64_t>> merged;
    for (const auto& [scope, span] : spans_) {
      for (uint32_t id = scope; id != 0;) {
        const auto info = r.scopes.find(id);
        if (info == r.scopes.end()) break;  // from before this recording
        auto [it, fresh] = merged.emplace(id, span);
        if (!fresh) {
          it->second.first = std::min(it->second.first, span.first);
          it->second.second = std::max(it->second.second, span.second);
        }
        id = info->second.parent;
      }
    }
    for (const auto& [id, span] : merged) {
      const ScopeInfo& info = r.scopes.at(id);
      Event e;
      e.name = info.path.empty() ? info.type : info.path;
      e.category = Category::kBackward;
      e.start_ns = span.first;
      e.dur_ns = span.second - span.first;
      e.path = info.path;
      e.type = info.type;
      out.push_back(std::move(e));
    }
  }
  spans_.clear();
  for (Event& e : out) record(std::move(e));
}

namespace {

// The length of the valid UTF-8 sequence at text[i], or 0 when none starts there.
size_t utf8_length(const std::string& text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  uint32_t min = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0)
    n = 2, min = 0x80;
  else if ((c & 0xF0) == 0xE0)
    n = 3, min = 0x800;
  else if ((c & 0xF8) == 0xF0)
    n = 4, min = 0x10000;
  else
    return 0;
  if (i + n > text.size()) return 0;
  uint32_t code = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i + k) & 0x3F);
  }
  if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
  return n;
}

void append_number(std::string& out, const char* key, double value, const char* format) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, format, value);
  out += ",\"";
  out += key;
  out += "\":";
  out += buffer;
}

}  // namespace

std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      char buffer[8];
      std::snprintf(buffer, sizeof buffer, "\\u%04x", c);
      out += buffer;
    } else {
      const size_t n = utf8_length(text, i);
      if (n == 0) {
        out += "\\ufffd";  // not UTF-8: the replacement character, so the file stays JSON
        ++i;
        continue;
      }
      out.append(text, i, n);
      i += n;
      continue;
    }
    ++i;
  }
  return out + "\"";
}

std::string chrome_trace_events(const std::vector<Event>& events, int pid, int64_t origin_ns) {
  const std::string p = std::to_string(pid);
  std::string out = "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + p +
                    ",\"tid\":0,\"args\":{\"name\":\"rank " + p + "\"}}";
  out += ",{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + p +
         ",\"tid\":0,\"args\":{\"sort_index\":" + p + "}}";
  std::map<int32_t, bool> used;
  for (const Event& e : events) used[e.row] = true;
  // Rows are numbered from 1: Perfetto takes tid 0 for a process's idle thread and files
  // other processes' events with it, so rank 1's rows would merge into rank 0's.
  const auto tid = [](int32_t row) { return std::to_string(row + 1); };
  for (const auto& [row, name] : row_names()) {
    if (!used.count(row)) continue;
    out += ",{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" + tid(row) +
           ",\"args\":{\"name\":" + json_string(name) + "}}";
  }
  for (const Event& e : events) {
    out += ",{\"name\":" + json_string(e.name) + ",\"cat\":\"" + category_name(e.category) +
           "\",\"ph\":\"X\",\"pid\":" + p + ",\"tid\":" + tid(e.row);
    append_number(out, "ts", static_cast<double>(e.start_ns - origin_ns) / 1e3, "%.3f");
    append_number(out, "dur", static_cast<double>(e.dur_ns) / 1e3, "%.3f");
    out += ",\"args\":{\"step\":" + std::to_string(e.step);
    if (e.bytes >= 0) out += ",\"bytes\":" + std::to_string(e.bytes);
    if (e.category == Category::kForward || e.category == Category::kBackward)
      out += ",\"module\":" + json_string(e.path) + ",\"type\":" + json_string(e.type);
    out += "}}";
  }
  return out;
}

void write_chrome_trace(std::ostream& out, const std::vector<std::string>& fragments) {
  out << "{\"traceEvents\":[";
  bool first = true;
  for (const std::string& f : fragments) {
    if (f.empty()) continue;
    if (!first) out << ",\n";
    out << f;
    first = false;
  }
  out << "],\"displayTimeUnit\":\"ms\"}\n";
}

}  // namespace ember::trace

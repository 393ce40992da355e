// The trace recorder: one process-wide recorder of timed events (module forward and backward,
// backward ops, DDP buckets' all-reduces, data-loading waits, optimizer steps, device
// intervals and named user ranges), written as Chrome Trace Event JSON that Perfetto and
// chrome://tracing open. Off unless a profiler turns it on: every event site costs one relaxed
// atomic load then. The user-facing API is ember::profiler (<ember/autograd/profiler.h>);
// this layer is what autograd, nn, dist and the trainer emit into.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ember/tensor/device.h>

namespace ember::trace {

struct DeviceInterval;

namespace detail {
extern std::atomic<bool> recording;
}  // namespace detail

// Whether events are being recorded: the check at every event site.
inline bool enabled() { return detail::recording.load(std::memory_order_relaxed); }

// The recorder's clock: steady_clock in nanoseconds.
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// What an event is: its "cat" in the trace, and what the overlap figures read.
enum class Category : uint8_t {
  kForward,    // a module's forward (name: its path in named_modules())
  kBackward,   // a module's backward: its autograd nodes, first start to last end
  kOp,         // one backward node (an op's backward formula)
  kAutograd,   // a whole backward pass
  kComm,       // a collective, on the row of the thread that watched it (bytes: its size)
  kWait,       // the host waiting for communication (DDP's wait for the last buckets)
  kData,       // waiting for the next batch
  kOptimizer,  // the optimizer step
  kStep,       // one training step (ProfilerStep#N)
  kUser,       // a record_function range
  kDevice,     // device-side interval from CUDA events, on its stream's row
};
const char* category_name(Category category);

struct Event {
  std::string name;
  Category category = Category::kUser;
  int64_t start_ns = 0, dur_ns = 0;  // now_ns() clock
  int32_t row = -1;                  // the Chrome "tid": a thread's or a CUDA stream's row
  int64_t step = -1;                 // the profiler step it fell in (-1: none)
  int64_t bytes = -1;                // kComm: bytes sent
  std::string path;                  // kForward/kBackward: path in named_modules() ("" the root)
  std::string type;                  // kForward/kBackward: the module's type name
};

// Rows. Each recording thread gets its own row on its first event; set_thread_row_name names
// the calling thread's ("main", "DDP all-reduce"). named_row gives the row of a name (one per
// name, for rows that are no thread: CUDA streams).
void set_thread_row_name(const std::string& name);
int32_t named_row(const std::string& name);
std::vector<std::pair<int32_t, std::string>> row_names();

// Recording. start() clears the buffer and turns recording on (ember::Error if it is on
// already: one recording at a time); discard() drops what was recorded so far and keeps
// recording (a profiler's warm-up); stop() turns it off and hands everything over, device
// intervals resolved (it waits for their CUDA events).
void start();
void discard();
std::vector<Event> stop();
// The step events are stamped with (the profiler's step counter).
void set_step(int64_t step);
// Appends one event (stamped with the current step) when recording; the row defaults to the
// calling thread's.
void record(Event event);
void record(Category category, std::string name, int64_t start_ns, int64_t end_ns,
            int64_t bytes = -1);

// A timed range on the calling thread's row, [construction, destruction), recorded when
// recording was on at construction; on CUDA builds also an NVTX range of the same name, and
// with a CUDA `device`, the device-side interval between CUDA events recorded on the current
// stream, on that stream's row.
class Range {
 public:
  Range(Category category, const char* name, Device device = Device()) {
    if (enabled()) begin(category, name, device);
  }
  Range(Category category, std::string name, Device device = Device()) {
    if (enabled()) begin(category, std::move(name), device);
  }
  ~Range() {
    if (start_ns_ >= 0) end();
  }
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  void begin(Category category, std::string name, Device device);
  void end();
  std::string name_;
  Category category_ = Category::kUser;
  int64_t start_ns_ = -1;
  std::shared_ptr<DeviceInterval> device_;  // its device interval, when it has one
};

// Module scopes: a module's forward runs inside one, and the autograd nodes created there
// carry its id, so a backward pass can time each module (BackwardSpans).
class ModuleScope {
 public:
  // path: the module's path in named_modules() ("" the root); type: its name().
  ModuleScope(std::string path, std::string type) {
    if (enabled()) begin(std::move(path), std::move(type));
  }
  ~ModuleScope() {
    if (id_ != 0) end();
  }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  void begin(std::string path, std::string type);
  void end();
  uint32_t id_ = 0, parent_ = 0;
  int64_t start_ns_ = 0;
  std::string path_, type_;
};
// The innermost open module scope on this thread (0: none): what a new autograd node records.
uint32_t current_scope();

// One backward pass's module spans: add() each node's run; finish() records one kBackward
// event per module scope touched (its nodes' and its submodules' first start to last end).
class BackwardSpans {
 public:
  void add(uint32_t scope, int64_t start_ns, int64_t end_ns);
  void finish();

 private:
  std::vector<std::pair<uint32_t, std::pair<int64_t, int64_t>>> spans_;
};

// Chrome Trace Event JSON. chrome_trace_events writes `events` of one process (pid: the
// rank) as comma-separated event objects: "M" events naming the process ("rank N") and its
// rows (tid: the row + 1), then one "X" event each, ts and dur in microseconds since origin_ns.
// write_chrome_trace wraps fragments (one per process) into {"traceEvents": [...]}.
std::string chrome_trace_events(const std::vector<Event>& events, int pid, int64_t origin_ns);
void write_chrome_trace(std::ostream& out, const std::vector<std::string>& fragments);
// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& text);

}  // namespace ember::trace

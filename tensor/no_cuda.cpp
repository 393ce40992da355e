// cuda.h for builds without the CUDA backend: no device is ever available, and everything
// that would need one throws ember::Error.
#include "cuda.h"
#include "cuda_graph.h"
#include "error.h"

namespace ember {
namespace {

[[noreturn]] void no_cuda(const char* function) {
  throw Error(detail::str_cat(function, ": ember was built without CUDA"));
}

}  // namespace

namespace cuda {

bool is_available() { return false; }
int device_count() { return 0; }
int current_device() { no_cuda("current_device"); }
void set_device(int /*device*/) { no_cuda("set_device"); }
void synchronize(int /*device*/) { no_cuda("synchronize"); }
std::pair<int, int> device_capability(int /*device*/) { no_cuda("device_capability"); }

Stream Stream::create(int /*device*/, bool /*high_priority*/) { no_cuda("Stream::create"); }
void Stream::synchronize() const { no_cuda("Stream::synchronize"); }
bool Stream::query() const { no_cuda("Stream::query"); }
Stream current_stream(int /*device*/) { no_cuda("current_stream"); }
void set_current_stream(Stream /*stream*/) { no_cuda("set_current_stream"); }

DeviceGuard::DeviceGuard(int /*device*/) { no_cuda("DeviceGuard"); }
DeviceGuard::~DeviceGuard() = default;

StreamGuard::StreamGuard(Stream /*stream*/) : previous_(), previous_device_(0) {
  no_cuda("StreamGuard");
}
StreamGuard::~StreamGuard() = default;

Event::Event(bool enable_timing) : enable_timing_(enable_timing) { no_cuda("Event"); }
Event::~Event() = default;
Event::Event(Event&& other) noexcept
    : handle_(other.handle_), enable_timing_(other.enable_timing_) {}
Event& Event::operator=(Event&& other) noexcept {
  handle_ = other.handle_;
  enable_timing_ = other.enable_timing_;
  return *this;
}
void Event::record(Stream /*stream*/) { no_cuda("Event::record"); }
void Event::wait(Stream /*stream*/) const { no_cuda("Event::wait"); }
void Event::synchronize() const { no_cuda("Event::synchronize"); }
bool Event::query() const { no_cuda("Event::query"); }
float Event::elapsed_ms(const Event& /*end*/) const { no_cuda("Event::elapsed_ms"); }

MemoryStats memory_stats(int /*device*/) { no_cuda("memory_stats"); }
void reset_peak_stats(int /*device*/) { no_cuda("reset_peak_stats"); }
void empty_cache() { no_cuda("empty_cache"); }
bool record_stream(void* /*ptr*/, Stream /*stream*/) { no_cuda("record_stream"); }

struct CUDAGraph::Impl {};
CUDAGraph::CUDAGraph() : impl_(std::make_unique<Impl>()) {}
CUDAGraph::~CUDAGraph() = default;
void CUDAGraph::capture_begin() { no_cuda("CUDAGraph::capture_begin"); }
void CUDAGraph::capture_end() { no_cuda("CUDAGraph::capture_end"); }
void CUDAGraph::replay() { no_cuda("CUDAGraph::replay"); }
void CUDAGraph::reset() {}  // nothing can have been captured
bool CUDAGraph::captured() const { return false; }
uint64_t CUDAGraph::pool() const { return 0; }
void capture(CUDAGraph& /*graph*/, const std::function<void()>& /*work*/) { no_cuda("capture"); }

}  // namespace cuda
}  // namespace ember

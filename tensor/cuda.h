// CUDA devices, streams, events and the caching allocator's statistics. Declared in every
// build: without the CUDA backend is_available() is false and the rest throws ember::Error.
// No CUDA header is included: a stream handle is the runtime's own cudaStream_t type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

struct CUstream_st;
struct CUevent_st;

namespace ember::cuda {

using StreamHandle = CUstream_st*;  // == cudaStream_t
using EventHandle = CUevent_st*;    // == cudaEvent_t

// True when ember was built with CUDA and at least one device is visible.
bool is_available();
int device_count();
int current_device();
void set_device(int device);
// (major, minor) compute capability of `device` (-1: the current device), as
// torch.cuda.get_device_capability: 8.0 and up (Ampere, Hopper) have bf16 and TF32 tensor cores.
std::pair<int, int> device_capability(int device = -1);
// Waits for all work on `device` (-1: the current device).
void synchronize(int device = -1);

// A stream on one device. The default-constructed Stream is the device's legacy default stream.
class Stream {
 public:
  Stream() = default;
  Stream(StreamHandle handle, int device) : handle_(handle), device_(device) {}
  // A new non-blocking stream owned by ember for the life of the process (pooled, like
  // PyTorch's); high priority suits communication.
  static Stream create(int device = -1, bool high_priority = false);

  StreamHandle handle() const { return handle_; }
  int device() const { return device_; }
  void synchronize() const;
  bool query() const;  // true when all work queued on it is done
  friend bool operator==(const Stream& a, const Stream& b) = default;

 private:
  StreamHandle handle_ = nullptr;
  int device_ = 0;
};

// The stream ops on `device` run on, for the calling thread (-1: the current device).
Stream current_stream(int device = -1);
void set_current_stream(Stream stream);

// Makes `device` current for the calling thread for a scope; the previous device comes back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: it was current already
};

// Makes `stream` current (and its device current) for a scope.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
  int previous_device_;
};

// Orders work across streams: record on one, wait on another.
class Event {
 public:
  explicit Event(bool enable_timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;

  void record(Stream stream);
  void wait(Stream stream) const;  // stream waits for the last record
  void synchronize() const;
  bool query() const;
  float elapsed_ms(const Event& end) const;
  EventHandle handle() const { return handle_; }

 private:
  EventHandle handle_ = nullptr;
  bool enable_timing_ = false;
};

// The caching allocator: freed blocks are kept per stream and reused, so steady-state
// training calls cudaMalloc zero times.
struct MemoryStats {
  size_t allocated_bytes = 0;  // in live tensors
  size_t reserved_bytes = 0;   // held from cudaMalloc
  size_t peak_allocated_bytes = 0;
  size_t peak_reserved_bytes = 0;
  uint64_t num_device_allocs = 0;  // cudaMalloc calls so far
  uint64_t num_device_frees = 0;   // cudaFree calls so far
};
MemoryStats memory_stats(int device = -1);
void reset_peak_stats(int device = -1);
// Returns every cached block that holds no live tensor to the driver.
void empty_cache();
// Marks `ptr` (a storage's data) as used by `stream`, so the caching allocator does not reuse
// its block before the work queued there finishes. False, recording nothing, for memory the
// allocator does not own (from_blob's): its owner orders its reuse, as in PyTorch.
bool record_stream(void* ptr, Stream stream);

}  // namespace ember::cuda

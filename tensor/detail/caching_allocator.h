// The caching allocator's device-independent core (PyTorch's design, simplified): blocks
// are cached per stream, split to serve smaller requests and merged with free neighbours
// when freed, so steady-state work makes no raw allocations. The raw memory comes from a
// DeviceMemory backend: cudaMalloc in tensor/cuda/, a fake in the tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "../cuda.h"

namespace ember::detail {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Raw memory, or nullptr when the device is out of memory.
  virtual void* raw_alloc(size_t nbytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  // An event recorded on `stream` now, whether it has completed, and its release: a block
  // used on other streams is reused only after their work is done.
  virtual void* record_event(void* stream) = 0;
  virtual bool event_done(void* event) = 0;
  virtual void destroy_event(void* event) = 0;
};

class CachingAllocator {
 public:
  explicit CachingAllocator(std::unique_ptr<DeviceMemory> memory);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least nbytes for use on `stream`; throws ember::Error when the device is
  // out of memory even after releasing the cache.
  void* allocate(size_t nbytes, void* stream);
  void free(void* ptr);
  // False, recording nothing, when `ptr` is not one of its live blocks.
  bool record_stream(void* ptr, void* stream);
  // Private pools (CUDA graphs, as PyTorch's graph memory pools): from begin_pool until
  // end_pool, allocations on `stream` come from pool `pool` (an id > 0, created on first use),
  // served by its own freed blocks, whole free segments taken from the general cache, or new
  // segments. Its blocks are never handed to allocations outside the pool, even once freed.
  void begin_pool(uint64_t pool, void* stream);
  void end_pool(void* stream);
  // The pool's owner is gone: its free segments return to the general cache for use on
  // `stream`, and the rest as their blocks are freed. The caller ensures that work which used
  // them (graph replays) has finished.
  void release_pool(uint64_t pool, void* stream);
  void empty_cache();
  cuda::MemoryStats stats() const;
  void reset_peak_stats();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace ember::detail

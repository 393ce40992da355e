// Allocators hand out the memory behind Storage: aligned host memory, pinned host memory,
// and the CUDA caching allocator (see cuda.h for its statistics and empty_cache()).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

#include "device.h"

namespace ember {

// Owns a block of memory and knows how to give it back; Storage keeps one alive.
using DataPtr = std::shared_ptr<void>;

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns `nbytes` of memory (a null DataPtr for 0 bytes); throws ember::Error when out of
  // memory.
  virtual DataPtr allocate(size_t nbytes) = 0;
};

inline constexpr size_t kCpuAlignment = 64;

// Host memory aligned to kCpuAlignment bytes. Freed blocks are cached (up to 1 GiB) and
// reused for requests of the same rounded size.
Allocator& cpu_allocator();
// cpu_allocator()'s bytes in live blocks (each block at the size it rounds to; freed blocks
// it keeps cached do not count) and their peak since start or reset_cpu_peak_memory_stats():
// the host counterpart of cuda::memory_stats() for checking what an op allocates.
struct CpuMemoryStats {
  size_t allocated_bytes = 0;
  size_t peak_allocated_bytes = 0;
};
CpuMemoryStats cpu_memory_stats();
// Sets the peak to the bytes allocated now.
void reset_cpu_peak_memory_stats();
// Page-locked host memory for fast, asynchronous host<->GPU copies. Needs a CUDA device;
// throws ember::Error otherwise. Freed blocks are cached (up to 1 GiB) by power-of-two size.
Allocator& pinned_allocator();

namespace detail {
// Work queued on CUDA stream `stream` (a cudaStream_t) reads or writes the pinned block at
// `block` (a Storage's base pointer): once freed, the block is handed out again only after
// that work has finished. Asynchronous copies call this; when it returns false (no event
// could be recorded) the caller must wait for its work instead.
bool record_pinned_use(const void* block, void* stream);
}  // namespace detail
// The allocator behind tensors on `device` (the caching allocator for CUDA devices).
Allocator& allocator_for(Device device);

}  // namespace ember

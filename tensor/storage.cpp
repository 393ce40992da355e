#include "storage.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include <ember/config.h>

#include "detail/kernel_table.h"
#include "error.h"

#if EMBER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ember {

namespace {

// NOTE: freed blocks are kept by rounded size and handed out again, so a training loop's
// steady state maps no fresh pages: on large tensors the page faults of a new buffer cost
// more than the arithmetic of an elementwise op. At most kMaxCachedBytes stay cached; the
// allocator is never destroyed, so tensors freed during static destruction still find it.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t size = rounded(nbytes);
    void* ptr = take_cached(size);
    if (ptr == nullptr) ptr = std::aligned_alloc(kCpuAlignment, size);
    EMBER_CHECK(ptr != nullptr, "cpu allocator", "out of memory allocating ", nbytes, " bytes");
    const size_t now = allocated_.fetch_add(size, std::memory_order_relaxed) + size;
    size_t peak = peak_.load(std::memory_order_relaxed);
    while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
    }
    return DataPtr(ptr, [this, size](void* p) {
      allocated_.fetch_sub(size, std::memory_order_relaxed);
      give_back(p, size);
    });
  }

  CpuMemoryStats stats() const {
    return {allocated_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed)};
  }
  void reset_peak() { peak_.store(allocated_.load(std::memory_order_relaxed)); }

 private:
  // Small blocks round to the alignment; large ones to 64 KiB, so near sizes share blocks.
  static size_t rounded(size_t nbytes) {
    const size_t unit = nbytes >= (size_t{1} << 20) ? size_t{1} << 16 : kCpuAlignment;
    return (nbytes + unit - 1) / unit * unit;
  }

  void* take_cached(size_t size) {
    std::lock_guard lock(mutex_);
    auto it = free_.find(size);
    if (it == free_.end() || it->second.empty()) return nullptr;
    void* ptr = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= size;
    return ptr;
  }

  void give_back(void* ptr, size_t size) {
    {
      std::lock_guard lock(mutex_);
      if (cached_bytes_ + size <= kMaxCachedBytes) {
        free_[size].push_back(ptr);
        cached_bytes_ += size;
        return;
      }
    }
    std::free(ptr);
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
  std::atomic<size_t> allocated_{0}, peak_{0};
};

#if EMBER_WITH_CUDA
// NOTE: cudaHostAlloc and cudaFreeHost cost milliseconds at megabytes, and cudaFreeHost waits
// for the whole device, so freed pinned blocks are kept by power-of-two size and handed out
// again (a loader pinning every batch, a process group staging every collective). A block that
// asynchronous copies used (record_pinned_use) goes out again only once the events recorded
// after those copies have completed. At most kMaxCachedBytes stay cached.
class PinnedAllocator final : public Allocator {
 public:
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    // Blocks too large to cache are not rounded: that would pin up to twice the bytes.
    const size_t size =
        nbytes > kMaxCachedBytes ? nbytes : std::bit_ceil(std::max<size_t>(nbytes, 512));
    void* ptr = take_cached(size);
    if (ptr == nullptr) ptr = fresh(size, nbytes);
    return DataPtr(ptr, [this, size](void* p) { give_back(p, size); });
  }

  // False when no event could be recorded: the caller must then wait for its copy.
  bool record_use(const void* block, cudaStream_t stream) {
    cudaEvent_t event = nullptr;
    cudaError_t status = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (status == cudaSuccess) status = cudaEventRecord(event, stream);
    if (status != cudaSuccess) {
      cudaGetLastError();
      if (event != nullptr) cudaEventDestroy(event);
      return false;
    }
    std::lock_guard lock(mutex_);
    std::vector<cudaEvent_t>& pending = uses_[block];
    drop_finished(pending);  // a buffer kept for many copies keeps only the running ones
    pending.push_back(event);
    return true;
  }

 private:
  struct Cached {
    void* ptr;
    std::vector<cudaEvent_t> pending;  // recorded after the copies that used the block
  };

  // Destroys the events that have completed; true when none is left.
  static bool drop_finished(std::vector<cudaEvent_t>& pending) {
    std::erase_if(pending, [](cudaEvent_t event) {
      const cudaError_t status = cudaEventQuery(event);
      // Clears "not ready" too: the runtime keeps it as the thread's last error, which the
      // next kernel launch's check would report.
      if (status != cudaSuccess) cudaGetLastError();
      if (status == cudaErrorNotReady) return false;  // (a failed copy no longer uses the block)
      cudaEventDestroy(event);
      return true;
    });
    return pending.empty();
  }

  static void wait_and_destroy(std::vector<cudaEvent_t>& pending) {
    for (cudaEvent_t event : pending) {
      cudaEventSynchronize(event);
      cudaEventDestroy(event);
    }
    pending.clear();
  }

  void* take_cached(size_t size) {
    std::lock_guard lock(mutex_);
    auto it = free_.find(size);
    if (it == free_.end()) return nullptr;
    for (auto block = it->second.begin(); block != it->second.end(); ++block) {
      if (!drop_finished(block->pending)) continue;
      void* ptr = block->ptr;
      it->second.erase(block);
      cached_bytes_ -= size;
      return ptr;
    }
    return nullptr;
  }

  void* fresh(size_t size, size_t nbytes) {
    void* ptr = nullptr;
    cudaError_t status = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
    if (status != cudaSuccess) {  // out of page-locked memory: give the cache back, try again
      cudaGetLastError();
      release_cache();
      status = cudaHostAlloc(&ptr, size, cudaHostAllocDefault);
    }
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw Error(detail::str_cat("pinned allocator: cudaHostAlloc of ", nbytes,
                                  " bytes failed: ", cudaGetErrorString(status)));
    }
    return ptr;
  }

  void give_back(void* ptr, size_t size) {
    std::vector<cudaEvent_t> pending;
    {
      std::lock_guard lock(mutex_);
      if (auto use = uses_.find(ptr); use != uses_.end()) {
        pending = std::move(use->second);
        uses_.erase(use);
      }
      if (cached_bytes_ + size <= kMaxCachedBytes) {
        free_[size].push_back({ptr, std::move(pending)});
        cached_bytes_ += size;
        return;
      }
    }
    wait_and_destroy(pending);
    cudaFreeHost(ptr);
  }

  void release_cache() {
    std::unordered_map<size_t, std::vector<Cached>> blocks;
    {
      std::lock_guard lock(mutex_);
      blocks.swap(free_);
      cached_bytes_ = 0;
    }
    for (auto& [size, list] : blocks) {
      for (Cached& block : list) {
        wait_and_destroy(block.pending);
        cudaFreeHost(block.ptr);
      }
    }
  }

  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Cached>> free_;
  std::unordered_map<const void*, std::vector<cudaEvent_t>> uses_;  // blocks handed out
  size_t cached_bytes_ = 0;
};
#else
class PinnedAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    throw Error(detail::str_cat("pinned allocator: pinned memory of ", nbytes,
                                " bytes needs CUDA, and ember was built without CUDA"));
  }
};
#endif

// Never destroyed, like the CPU allocator: pinned tensors freed at exit still find it.
PinnedAllocator& pinned() {
  static PinnedAllocator* const allocator = new PinnedAllocator;
  return *allocator;
}

CpuAllocator& cpu() {
  static CpuAllocator* const allocator = new CpuAllocator;
  return *allocator;
}

}  // namespace

Allocator& cpu_allocator() { return cpu(); }
CpuMemoryStats cpu_memory_stats() { return cpu().stats(); }
void reset_cpu_peak_memory_stats() { cpu().reset_peak(); }

Allocator& pinned_allocator() { return pinned(); }

namespace detail {
bool record_pinned_use(const void* block, void* stream) {
#if EMBER_WITH_CUDA
  return pinned().record_use(block, static_cast<cudaStream_t>(stream));
#else
  (void)block;
  (void)stream;
  return false;
#endif
}
}  // namespace detail

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  const auto& table = detail::kernel_table(device.type);
  EMBER_CHECK(table.allocator != nullptr, "allocate", "no allocator for ", device.str(),
              ": ember was built without CUDA");
  return *table.allocator(device.index);
}

Storage::Storage(size_t nbytes, Device device, Allocator* allocator)
    : impl_(std::make_shared<Impl>()) {
  Allocator& chosen = allocator != nullptr ? *allocator : allocator_for(device);
  impl_->data = chosen.allocate(nbytes);
  impl_->nbytes = nbytes;
  impl_->device = device;
  impl_->pinned = &chosen == &pinned_allocator();
}

Storage::Storage(DataPtr owner, size_t nbytes, Device device) : impl_(std::make_shared<Impl>()) {
  impl_->data = std::move(owner);
  impl_->nbytes = nbytes;
  impl_->device = device;
}

}  // namespace ember

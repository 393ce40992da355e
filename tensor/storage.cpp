#include "storage.h"

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
    return DataPtr(ptr, [this, size](void* p) { give_back(p, size); });
  }

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
};

class PinnedAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
#if EMBER_WITH_CUDA
    void* ptr = nullptr;
    const cudaError_t status = cudaHostAlloc(&ptr, nbytes, cudaHostAllocDefault);
    if (status != cudaSuccess) {
      cudaGetLastError();
      throw Error(detail::str_cat("pinned allocator: cudaHostAlloc of ", nbytes,
                                  " bytes failed: ", cudaGetErrorString(status)));
    }
    return DataPtr(ptr, [](void* p) { cudaFreeHost(p); });
#else
    throw Error(detail::str_cat("pinned allocator: pinned memory of ", nbytes,
                                " bytes needs CUDA, and ember was built without CUDA"));
#endif
  }
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator* const allocator = new CpuAllocator;
  return *allocator;
}

Allocator& pinned_allocator() {
  static PinnedAllocator allocator;
  return allocator;
}

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

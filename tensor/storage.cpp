#include "storage.h"

#include <cstdlib>
#include <new>

#include <ember/config.h>

#include "detail/kernel_table.h"
#include "error.h"

#if EMBER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ember {

namespace {

class CpuAllocator final : public Allocator {
 public:
  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    EMBER_CHECK(ptr != nullptr, "cpu allocator", "out of memory allocating ", nbytes, " bytes");
    return DataPtr(ptr, [](void* p) { std::free(p); });
  }
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
  static CpuAllocator allocator;
  return allocator;
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

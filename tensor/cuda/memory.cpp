// CUDA memory: the caching allocator's cudaMalloc backend, one allocator per device, its
// statistics (cuda.h), and copies between the host and devices (the table's `transfer`).
#include <memory>
#include <vector>

#include "../cuda.h"
#include "../detail/caching_allocator.h"
#include "cuda_check.h"
#include "cuda_context.h"
#include "device.cuh"

namespace ember::detail {
namespace {

class CudaDeviceMemory final : public DeviceMemory {
 public:
  explicit CudaDeviceMemory(int device) : device_(device) {}

  void* raw_alloc(size_t nbytes) override {
    cuda::DeviceGuard guard(device_);
    void* ptr = nullptr;
    // NOTE: a thread capturing a CUDA graph may not call cudaMalloc unless its capture mode
    // is relaxed for the call (as PyTorch's allocator does); the graph's pool needs memory.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    EMBER_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t status = cudaMalloc(&ptr, nbytes);
    EMBER_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // the caching allocator frees its cache and retries
      return nullptr;
    }
    EMBER_CUDA_CHECK(status);
    return ptr;
  }

  void raw_free(void* ptr) override {
    cuda::DeviceGuard guard(device_);
    EMBER_CUDA_CHECK(cudaFree(ptr));
  }

  void* record_event(void* stream) override {
    cuda::DeviceGuard guard(device_);
    cudaEvent_t event = nullptr;
    EMBER_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    const cudaError_t status = cudaEventRecord(event, static_cast<cudaStream_t>(stream));
    if (status != cudaSuccess) {
      cudaEventDestroy(event);
      EMBER_CUDA_CHECK(status);
    }
    return event;
  }

  bool event_done(void* event) override {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    EMBER_CUDA_CHECK(status);
    return true;
  }

  void destroy_event(void* event) override {
    EMBER_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
  }

 private:
  int device_;
};

// Tensors on one device: blocks come from that device's caching allocator, for use on the
// current stream, and go back to it when the last Storage lets go.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device)
      : device_(device), cache_(std::make_unique<CudaDeviceMemory>(device)) {}

  DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    cuda::DeviceGuard guard(device_);
    void* ptr = cache_.allocate(nbytes, current_cuda_stream(device_));
    CachingAllocator* cache = &cache_;
    const int device = device_;
    return DataPtr(ptr, [cache, device](void* p) {
      try {
        cuda::DeviceGuard free_guard(device);
        cache->free(p);
      } catch (...) {
        // A deleter cannot throw; the only failures here are a dying CUDA context.
      }
    });
  }

  CachingAllocator& cache() { return cache_; }

 private:
  int device_;
  CachingAllocator cache_;
};

// One allocator per device, never destroyed: tensors in static storage may outlive main().
CudaAllocator& cuda_allocator(int device) {
  static std::vector<CudaAllocator*>* allocators = [] {
    auto* result = new std::vector<CudaAllocator*>();
    for (int d = 0; d < cuda::device_count(); ++d) result->push_back(new CudaAllocator(d));
    return result;
  }();
  const int count = cuda::device_count();
  EMBER_CHECK(count > 0, "allocate", "cannot use cuda:", device, ": no CUDA device is visible");
  EMBER_CHECK(device >= 0 && device < count, "allocate", "cannot use cuda:", device, ": only ",
              count, " CUDA device", count == 1 ? " is" : "s are", " visible");
  return *(*allocators)[static_cast<size_t>(device)];
}

Allocator* allocator_cuda(int device) { return &cuda_allocator(device); }

void transfer_cuda(const Tensor& dst, const Tensor& src, bool non_blocking) {
  const size_t nbytes = dst.nbytes();
  EMBER_ASSERT(nbytes == src.nbytes() && dst.dtype() == src.dtype(),
               "transfer: mismatched tensors");
  if (nbytes == 0) return;
  if (dst.is_cuda() && src.is_cuda()) {
    const int src_device = src.device().index, dst_device = dst.device().index;
    KernelContext ctx(src_device);
    if (src_device == dst_device) {  // stream order is enough
      EMBER_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes,
                                       cudaMemcpyDeviceToDevice, ctx.stream));
      return;
    }
    // Across devices: the copy runs on the source's stream after the destination's pending
    // work, and the destination's stream waits for the copy.
    cuda::Stream src_stream(ctx.stream, src_device);
    cuda::Stream dst_stream(current_cuda_stream(dst_device), dst_device);
    cuda::Event dst_ready, copied;
    dst_ready.record(dst_stream);
    dst_ready.wait(src_stream);
    EMBER_CUDA_CHECK(cudaMemcpyPeerAsync(dst.data_ptr(), dst_device, src.data_ptr(), src_device,
                                         nbytes, ctx.stream));
    copied.record(src_stream);
    copied.wait(dst_stream);
    if (!non_blocking) EMBER_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
    return;
  }
  const bool to_device = dst.is_cuda();
  const Tensor& device_side = to_device ? dst : src;
  const Tensor& host_side = to_device ? src : dst;
  KernelContext ctx(device_side);
  EMBER_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes,
                                   to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                   ctx.stream));
  // Pageable host memory, or a blocking copy: the host buffer must be safe to use on return.
  // Else the pinned block must not be handed out again before the copy is done.
  if (!non_blocking || !host_side.is_pinned() ||
      !detail::record_pinned_use(host_side.storage().data(), ctx.stream)) {
    EMBER_CUDA_CHECK(cudaStreamSynchronize(ctx.stream));
  }
}

}  // namespace

CachingAllocator& cuda_caching_allocator(int device) { return cuda_allocator(device).cache(); }

EMBER_REGISTER_CUDA_KERNELS(memory) {
  table.allocator = allocator_cuda;
  table.transfer = transfer_cuda;
}

}  // namespace ember::detail

namespace ember::cuda {

MemoryStats memory_stats(int device) {
  return detail::cuda_allocator(detail::resolve_cuda_device(device, "memory_stats"))
      .cache()
      .stats();
}

void reset_peak_stats(int device) {
  detail::cuda_allocator(detail::resolve_cuda_device(device, "reset_peak_stats"))
      .cache()
      .reset_peak_stats();
}

void empty_cache() {
  for (int device = 0; device < device_count(); ++device) {
    cuda::DeviceGuard guard(device);
    detail::cuda_allocator(device).cache().empty_cache();
  }
}

bool record_stream(void* ptr, Stream stream) {
  if (ptr == nullptr) return false;
  cudaPointerAttributes attributes{};
  EMBER_CUDA_CHECK(cudaPointerGetAttributes(&attributes, ptr));
  // Managed, host or unknown memory is never the caching allocator's.
  if (attributes.type != cudaMemoryTypeDevice) return false;
  return detail::cuda_allocator(attributes.device).cache().record_stream(ptr, stream.handle());
}

}  // namespace ember::cuda

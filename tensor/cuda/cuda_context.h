// Device and stream helpers the CUDA kernels share. Private to tensor/cuda/.
#pragma once

#include <cuda_runtime.h>

#include "../cuda.h"
#include "../tensor.h"

namespace ember::detail {

// ember::Error naming `op` unless `device` is a visible CUDA ordinal.
void check_cuda_device(int device, const char* op);
// `device`, or the current device for -1, checked as above.
int resolve_cuda_device(int device, const char* op);

// The calling thread's current stream on `device`.
cudaStream_t current_cuda_stream(int device);

class CachingAllocator;
// The caching allocator of `device` (CUDA graphs route their captures' memory through it).
CachingAllocator& cuda_caching_allocator(int device);

// Guards t's device and yields the stream ops on it run on.
struct KernelContext {
  explicit KernelContext(const Tensor& t)
      : guard(t.device().index), stream(current_cuda_stream(t.device().index)) {}
  explicit KernelContext(int device) : guard(device), stream(current_cuda_stream(device)) {}
  cuda::DeviceGuard guard;
  cudaStream_t stream;
};

}  // namespace ember::detail

// cuDNN plumbing shared by the conv and batch-norm kernels: one handle per device bound to
// ember's current stream, RAII descriptors, dtype mapping, and workspace from the caching
// allocator. Private to tensor/cuda/.
#pragma once

#include <cudnn.h>

#include <cstdint>
#include <mutex>

#include "../tensor.h"
#include "cuda_check.h"
#include "cuda_context.h"

namespace ember::detail {

// The device's handle, locked for the lifetime of this object and bound to the calling
// thread's current stream on that device (which also guards the device).
class CudnnHandle {
 public:
  explicit CudnnHandle(int device);
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return handle_; }
  cudaStream_t stream() const { return ctx_.stream; }

 private:
  KernelContext ctx_;
  std::unique_lock<std::mutex> lock_;
  cudnnHandle_t handle_ = nullptr;
};

// The cuDNN element type of a floating dtype; ember::Error naming `op` for others.
cudnnDataType_t cudnn_data_type(DType dtype, const char* op);

// A size as cuDNN's int, or ember::Error naming `op` when it does not fit.
int cudnn_int(int64_t value, const char* op);

// alpha = 1 / beta = 0 scaling factors in the type cuDNN reads for `dtype` (double for f64,
// float otherwise).
struct CudnnScale {
  explicit CudnnScale(DType dtype) : is_double(dtype == kF64) {}
  const void* one() const { return is_double ? static_cast<const void*>(&one_d) : &one_f; }
  const void* zero() const { return is_double ? static_cast<const void*>(&zero_d) : &zero_f; }
  bool is_double;
  float one_f = 1.0f, zero_f = 0.0f;
  double one_d = 1.0, zero_d = 0.0;
};

class TensorDescriptor {
 public:
  TensorDescriptor();
  ~TensorDescriptor();
  TensorDescriptor(const TensorDescriptor&) = delete;
  TensorDescriptor& operator=(const TensorDescriptor&) = delete;
  // Packed NCHW, or packed NHWC (CUDNN_TENSOR_NHWC) for a channels-last tensor.
  void set(cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w, const char* op,
           bool channels_last = false);
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

class FilterDescriptor {
 public:
  FilterDescriptor();
  ~FilterDescriptor();
  FilterDescriptor(const FilterDescriptor&) = delete;
  FilterDescriptor& operator=(const FilterDescriptor&) = delete;
  // Weights [O, C, kH, kW] packed as OIHW, or as OHWI (CUDNN_TENSOR_NHWC) when channels-last.
  void set(cudnnDataType_t type, int64_t o, int64_t c, int64_t h, int64_t w, const char* op,
           bool channels_last = false);
  cudnnFilterDescriptor_t get() const { return desc_; }

 private:
  cudnnFilterDescriptor_t desc_ = nullptr;
};

class ConvolutionDescriptor {
 public:
  ConvolutionDescriptor();
  ~ConvolutionDescriptor();
  ConvolutionDescriptor(const ConvolutionDescriptor&) = delete;
  ConvolutionDescriptor& operator=(const ConvolutionDescriptor&) = delete;
  cudnnConvolutionDescriptor_t get() const { return desc_; }

 private:
  cudnnConvolutionDescriptor_t desc_ = nullptr;
};

// A device buffer of `nbytes` from the caching allocator (on the current stream), held by
// the returned tensor; undefined for 0 bytes.
Tensor cudnn_workspace(size_t nbytes, Device device);

}  // namespace ember::detail

// cuDNN handles, descriptors and errors: see cudnn_context.h.
#include "cudnn_context.h"

#include <climits>
#include <vector>

#include "../cuda.h"
#include "../ops.h"

namespace ember::detail {

void throw_cudnn_error(int status, const char* call, const char* file, int line) {
  const auto s = static_cast<cudnnStatus_t>(status);
  throw Error(str_cat("cuDNN error: ", call, " failed: ", cudnnGetErrorString(s), " (", status,
                      ") at ", file, ":", line));
}

namespace {

struct HandleSlot {
  std::mutex mutex;  // cudnnSetStream and the calls that follow form one unit
  cudnnHandle_t handle = nullptr;
};

// One slot per device, created on first use and kept for the process.
HandleSlot& handle_slot(int device) {
  static std::vector<HandleSlot>* slots =
      new std::vector<HandleSlot>(static_cast<size_t>(cuda::device_count()));
  EMBER_ASSERT(device >= 0 && device < static_cast<int>(slots->size()), "cuDNN handle for device ",
               device);
  return (*slots)[static_cast<size_t>(device)];
}

}  // namespace

CudnnHandle::CudnnHandle(int device) : ctx_(device), lock_(handle_slot(device).mutex) {
  HandleSlot& slot = handle_slot(device);
  if (slot.handle == nullptr) EMBER_CUDNN_CHECK(cudnnCreate(&slot.handle));
  handle_ = slot.handle;
  EMBER_CUDNN_CHECK(cudnnSetStream(handle_, ctx_.stream));
}

cudnnDataType_t cudnn_data_type(DType dtype, const char* op) {
  switch (dtype) {
    case kF32:
      return CUDNN_DATA_FLOAT;
    case kF64:
      return CUDNN_DATA_DOUBLE;
    case kF16:
      return CUDNN_DATA_HALF;
    case kBF16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw Error(str_cat(op, ": dtype ", dtype, " is not supported by cuDNN"));
  }
}

int cudnn_int(int64_t value, const char* op) {
  EMBER_CHECK(value >= 0 && value <= INT_MAX, op, "size ", value, " exceeds cuDNN's 32-bit limit");
  return static_cast<int>(value);
}

TensorDescriptor::TensorDescriptor() { EMBER_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_)); }
TensorDescriptor::~TensorDescriptor() { cudnnDestroyTensorDescriptor(desc_); }

void TensorDescriptor::set(cudnnDataType_t type, int64_t n, int64_t c, int64_t h, int64_t w,
                           const char* op, bool channels_last) {
  cudnn_int(n * c * h * w, op);  // cuDNN's strides are ints
  const cudnnTensorFormat_t format = channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  EMBER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(
      desc_, format, type, cudnn_int(n, op), cudnn_int(c, op), cudnn_int(h, op), cudnn_int(w, op)));
}

FilterDescriptor::FilterDescriptor() { EMBER_CUDNN_CHECK(cudnnCreateFilterDescriptor(&desc_)); }
FilterDescriptor::~FilterDescriptor() { cudnnDestroyFilterDescriptor(desc_); }

void FilterDescriptor::set(cudnnDataType_t type, int64_t o, int64_t c, int64_t h, int64_t w,
                           const char* op, bool channels_last) {
  cudnn_int(o * c * h * w, op);
  const cudnnTensorFormat_t format = channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
  EMBER_CUDNN_CHECK(cudnnSetFilter4dDescriptor(
      desc_, type, format, cudnn_int(o, op), cudnn_int(c, op), cudnn_int(h, op), cudnn_int(w, op)));
}

ConvolutionDescriptor::ConvolutionDescriptor() {
  EMBER_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&desc_));
}
ConvolutionDescriptor::~ConvolutionDescriptor() { cudnnDestroyConvolutionDescriptor(desc_); }

Tensor cudnn_workspace(size_t nbytes, Device device) {
  if (nbytes == 0) return Tensor();
  return empty({static_cast<int64_t>(nbytes)}, TensorOptions(kU8, device));
}

}  // namespace ember::detail

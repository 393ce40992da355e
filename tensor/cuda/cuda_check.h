// Turns every CUDA runtime and cuBLAS status into an ember::Error naming the call, the
// status, and where it happened. Private to tensor/cuda/.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "../error.h"

namespace ember::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file,
                                   int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file,
                                     int line);
// cuDNN's status travels as an int so this header needs no cuDNN include (see cudnn_context.h).
[[noreturn]] void throw_cudnn_error(int status, const char* call, const char* file, int line);

}  // namespace ember::detail

#define EMBER_CUDA_CHECK(expr)                                                          \
  do {                                                                                  \
    const cudaError_t ember_cuda_status_ = (expr);                                      \
    if (ember_cuda_status_ != cudaSuccess) {                                            \
      ::ember::detail::throw_cuda_error(ember_cuda_status_, #expr, __FILE__, __LINE__); \
    }                                                                                   \
  } while (0)

#define EMBER_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                      \
    const cublasStatus_t ember_cublas_status_ = (expr);                                     \
    if (ember_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                    \
      ::ember::detail::throw_cublas_error(ember_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                                       \
  } while (0)

// For files that include <cudnn.h> (through cudnn_context.h).
#define EMBER_CUDNN_CHECK(expr)                                                       \
  do {                                                                                \
    const auto ember_cudnn_status_ = (expr);                                          \
    if (ember_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                \
      ::ember::detail::throw_cudnn_error(static_cast<int>(ember_cudnn_status_), #expr, \
                                         __FILE__, __LINE__);                         \
    }                                                                                 \
  } while (0)

// After every kernel launch: reports a bad launch configuration or an earlier async error.
#define EMBER_CUDA_CHECK_LAUNCH() EMBER_CUDA_CHECK(cudaGetLastError())

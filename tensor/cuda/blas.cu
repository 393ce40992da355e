// GEMM on cuBLAS: one handle per device, on the current stream, fp32 accumulation for the
// 16-bit floats. f32 runs in full f32 (matching the CPU within float rounding) unless
// set_float32_matmul_precision allows TF32 (tensor/precision.h).
#include <climits>
#include <mutex>
#include <vector>

#include "../cuda.h"
#include "../detail/dispatch.h"
#include "../precision.h"
#include "cuda_kernels.h"
#include "launch.cuh"

namespace ember::detail {
namespace {

struct BlasHandle {
  std::mutex mutex;  // cublasSetStream and the call that follows form one unit
  cublasHandle_t handle = nullptr;
};

// The device's handle, created on first use and kept for the process.
BlasHandle& blas_handle(int device) {
  static std::vector<BlasHandle>* handles =
      new std::vector<BlasHandle>(static_cast<size_t>(cuda::device_count()));
  BlasHandle& h = (*handles)[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(h.mutex);
  if (h.handle == nullptr) {
    cuda::DeviceGuard guard(device);
    cublasHandle_t created = nullptr;
    EMBER_CUBLAS_CHECK(cublasCreate(&created));
    EMBER_CUBLAS_CHECK(cublasSetMathMode(created, CUBLAS_DEFAULT_MATH));  // TF32: per call
    h.handle = created;
  }
  return h;
}

// C = beta * C for the empty (k == 0) product; beta == 0 writes zeros without reading C.
template <typename T>
__global__ void scale_kernel(T* c, int64_t batch, int64_t m, int64_t n, int64_t ldc,
                             int64_t stride_c, double beta) {
  using C = compute_t<T>;
  const int64_t total = batch * m * n;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const int64_t col = i % n, row = (i / n) % m, b = i / (n * m);
    T& x = c[b * stride_c + row * ldc + col];
    x = beta == 0.0 ? T(0) : cast_to<T>(cast_to<C>(x) * static_cast<C>(beta));
  }
}

// A row-major matrix with one row has no meaningful row stride; cuBLAS still wants ld >= cols.
int blas_ld(int64_t ld, int64_t rows, int64_t cols) {
  if (rows <= 1) ld = std::max<int64_t>(ld, cols);
  return static_cast<int>(std::max<int64_t>(ld, 1));
}

void gemm(const GemmArgs& g) {
  EMBER_ASSERT(g.device.is_cuda(), "cuda gemm got a ", g.device.str(), " operand");
  EMBER_ASSERT(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  KernelContext ctx(g.device.index);
  if (g.k == 0) {
    dispatch_floating(g.dtype, "matmul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      scale_kernel<T><<<grid_for(g.batch * g.m * g.n), kBlockSize, 0, ctx.stream>>>(
          static_cast<T*>(g.c), g.batch, g.m, g.n, g.ldc, g.stride_c, g.beta);
      EMBER_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  EMBER_CHECK(g.m <= INT_MAX && g.n <= INT_MAX && g.k <= INT_MAX && g.batch <= INT_MAX &&
                  g.lda <= INT_MAX && g.ldb <= INT_MAX && g.ldc <= INT_MAX,
              "matmul", "sizes (m ", g.m, ", n ", g.n, ", k ", g.k, ", batch ", g.batch,
              ") exceed cuBLAS's 32-bit limit");
  cudaDataType_t data_type;
  cublasComputeType_t compute_type = CUBLAS_COMPUTE_32F;
  switch (g.dtype) {
    case kF32:
      data_type = CUDA_R_32F;
      if (matmul_allow_tf32()) compute_type = CUBLAS_COMPUTE_32F_FAST_TF32;
      break;
    case kF64:
      data_type = CUDA_R_64F;
      compute_type = CUBLAS_COMPUTE_64F;
      break;
    case kF16:
      data_type = CUDA_R_16F;
      break;
    case kBF16:
      data_type = CUDA_R_16BF;
      break;
    default:
      throw Error(str_cat("matmul: dtype ", g.dtype, " is not supported on CUDA"));
  }
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(g.beta);
  const void* alpha = compute_type == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&g.alpha)
                                                         : static_cast<const void*>(&alpha_f);
  const void* beta = compute_type == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&g.beta)
                                                        : static_cast<const void*>(&beta_f);
  // NOTE: GemmArgs is row-major and cuBLAS column-major. A row-major matrix read as
  // column-major is its transpose, so C^T = op(B)^T op(A)^T: swap A and B, and m and n.
  const int ld_b = g.trans_b ? blas_ld(g.ldb, g.n, g.k) : blas_ld(g.ldb, g.k, g.n);
  const int ld_a = g.trans_a ? blas_ld(g.lda, g.k, g.m) : blas_ld(g.lda, g.m, g.k);
  const int ld_c = blas_ld(g.ldc, g.m, g.n);
  BlasHandle& h = blas_handle(g.device.index);
  std::lock_guard<std::mutex> lock(h.mutex);
  EMBER_CUBLAS_CHECK(cublasSetStream(h.handle, ctx.stream));
  EMBER_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h.handle, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), alpha, g.b, data_type,
      ld_b, g.stride_b, g.a, data_type, ld_a, g.stride_a, beta, g.c, data_type, ld_c, g.stride_c,
      static_cast<int>(g.batch), compute_type, CUBLAS_GEMM_DEFAULT));
}

// Fused linear's epilogue after the GEMM: out[r, j] = relu(in[r, j] + bias[j]) in one pass
// (bias null: relu alone), in the compute type and rounded once, NaN passing through as in
// relu.
template <typename T>
__global__ void bias_relu_kernel(T* out, const T* in, const T* bias, int64_t total, int64_t n) {
  using A = compute_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const A v = cast_to<A>(in[i]) + (bias != nullptr ? cast_to<A>(bias[i % n]) : A(0));
    out[i] = cast_to<T>(v < A(0) ? A(0) : v);
  }
}

void bias_activation(Activation activation, const Tensor& out, const Tensor& in,
                     const Tensor& bias) {
  EMBER_ASSERT(in.is_contiguous() && out.is_contiguous() && activation == Activation::kRelu);
  const int64_t n = in.dim() > 0 ? in.size(-1) : 1;
  if (in.numel() == 0 || n == 0) return;
  const KernelContext ctx(in);
  dispatch_floating(in.dtype(), "linear", [&](auto tag) {
    using T = typename decltype(tag)::type;
    bias_relu_kernel<T><<<grid_for(in.numel()), kBlockSize, 0, ctx.stream>>>(
        out.data_ptr<T>(), in.data_ptr<T>(), bias.defined() ? bias.data_ptr<T>() : nullptr,
        in.numel(), n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void register_cuda_blas_kernels(KernelTable& table) {
  table.gemm = gemm;
  table.bias_activation = bias_activation;
}

}  // namespace ember::detail

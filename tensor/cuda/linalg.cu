// GEMM on cuBLAS: one handle per device, on the current stream, fp32 accumulation for the
// 16-bit floats. f32 runs in full f32 (matching the CPU within float rounding) unless
// set_float32_matmul_precision allows TF32 (tensor/precision.h). A GEMM with a bias (a linear
// layer's addmm) runs on cuBLASLt with its bias epilogue, so the bias costs no pass of its own;
// where cuBLASLt offers no algorithm, the bias is written into C and the GEMM adds onto it.
#if !defined(EMBER_CUDA_EMULATED)  // cuBLAS: GPU-only (emulated builds take the kernels alone)
#include <cublasLt.h>
#endif

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <vector>

#include "../cuda.h"
#include "../detail/dispatch.h"
#include "../precision.h"
#include "launch.cuh"
#if !defined(EMBER_CUDA_EMULATED)
#include "cudnn_context.h"
#endif

EMBER_KERNELS_BEGIN
namespace {

#if !defined(EMBER_CUDA_EMULATED)  // cuBLAS: GPU-only (emulated builds take the kernels alone)
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

// A row-major matrix with one row has no meaningful row stride; cuBLAS still wants ld >= cols.
int blas_ld(int64_t ld, int64_t rows, int64_t cols) {
  if (rows <= 1) ld = std::max<int64_t>(ld, cols);
  return static_cast<int>(std::max<int64_t>(ld, 1));
}

#endif  // !EMBER_CUDA_EMULATED

// C = beta * C for the empty (k == 0) product; beta == 0 writes zeros without reading C.
template <typename T>
__global__ void scale_kernel(T* c, int64_t batch, int64_t m, int64_t n, int64_t ldc,
                             int64_t stride_c, double beta) {
  using C = acc_t<T>;
  const int64_t total = batch * m * n;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const int64_t col = i % n, row = (i / n) % m, b = i / (n * m);
    T& x = c[b * stride_c + row * ldc + col];
    x = beta == 0.0 ? T(0) : cast_to<T>(cast_to<C>(x) * static_cast<C>(beta));
  }
}

// Every row of every C starts as the bias (the fallback of the bias epilogue, then beta 1).
template <typename T>
__global__ void fill_rows_kernel(T* c, const T* bias, int64_t batch, int64_t m, int64_t n,
                                 int64_t ldc, int64_t stride_c) {
  const int64_t total = batch * m * n;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const int64_t col = i % n, row = (i / n) % m, b = i / (n * m);
    c[b * stride_c + row * ldc + col] = bias[col];
  }
}

void fill_rows_with_bias(const GemmArgs& g, cudaStream_t stream) {
  dispatch_floating(g.dtype, "addmm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(g.batch * g.m * g.n), kBlockSize, 0, stream, fill_rows_kernel<T>)
    (static_cast<T*>(g.c), static_cast<const T*>(g.bias), g.batch, g.m, g.n, g.ldc, g.stride_c);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// C = beta * C for the empty (k == 0) product.
void scale_empty_product(const GemmArgs& g, cudaStream_t stream) {
  dispatch_floating(g.dtype, "matmul", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(g.batch * g.m * g.n), kBlockSize, 0, stream, scale_kernel<T>)
    (static_cast<T*>(g.c), g.batch, g.m, g.n, g.ldc, g.stride_c, g.beta);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

#if !defined(EMBER_CUDA_EMULATED)  // cuBLAS: GPU-only (emulated builds take the kernels alone)
// ---- cuBLASLt: the bias epilogue -----------------------------------------------------------

// cuBLASLt handles are not tied to a stream (it is an argument of each call); one per device.
cublasLtHandle_t lt_handle(int device) {
  static std::mutex mutex;
  static std::vector<cublasLtHandle_t>* handles =
      new std::vector<cublasLtHandle_t>(static_cast<size_t>(cuda::device_count()), nullptr);
  std::lock_guard<std::mutex> lock(mutex);
  cublasLtHandle_t& h = (*handles)[static_cast<size_t>(device)];
  if (h == nullptr) {
    cuda::DeviceGuard guard(device);
    EMBER_CUBLAS_CHECK(cublasLtCreate(&h));
  }
  return h;
}

// Workspace offered to cuBLASLt's kernels (split-K and the like), from the caching allocator.
constexpr size_t kLtWorkspaceBytes = size_t{4} << 20;

// The largest power of two (up to 16) dividing the address: cuBLASLt's algorithms state the
// alignment they need, so the heuristic is told what the operands have.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 16;
  while (a > 1 && address % a != 0) a /= 2;
  return a;
}

// RAII owners of cuBLASLt's descriptors.
struct LtMatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  ~LtMatmulDesc() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
  }
};
struct LtLayout {
  cublasLtMatrixLayout_t layout = nullptr;
  ~LtLayout() {
    if (layout != nullptr) cublasLtMatrixLayoutDestroy(layout);
  }
};
struct LtPreference {
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtPreference() {
    if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  }
};

// The heuristic's choice per problem (shapes, types, layouts, alignments), kept for the process
// like the convolution algorithms; nullopt: cuBLASLt has no algorithm for it.
using LtKey = std::tuple<int, int, int, int, int, int, int, int, int, int, int, uint32_t>;
struct LtAlgoCache {
  std::mutex mutex;
  std::map<LtKey, std::optional<cublasLtMatmulAlgo_t>> algos;
};
LtAlgoCache& lt_algo_cache() {
  static LtAlgoCache* cache = new LtAlgoCache();
  return *cache;
}

// C = alpha * op(A) @ op(B) + bias in one cuBLASLt call (column-major view as in gemm below:
// A' = B, B' = A, m' = n, n' = m). False, having written nothing, when cuBLASLt offers no
// algorithm for the problem; then the caller takes the fill-and-add path.
bool gemm_bias_lt(const GemmArgs& g, cudaDataType_t data_type, cublasComputeType_t compute_type,
                  const void* alpha, int ld_a, int ld_b, int ld_c, cudaStream_t stream) {
  if (g.batch != 1) return false;
  const cudaDataType_t scale_type = compute_type == CUBLAS_COMPUTE_64F ? CUDA_R_64F : CUDA_R_32F;
  const cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // A' = B
  const cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // B' = A
  const auto m = static_cast<uint64_t>(g.n), n = static_cast<uint64_t>(g.m),
             k = static_cast<uint64_t>(g.k);
  const uint32_t align =
      std::min({alignment_of(g.a), alignment_of(g.b), alignment_of(g.c), alignment_of(g.bias)});

  LtMatmulDesc desc;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc.desc, compute_type, scale_type));
  EMBER_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  EMBER_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                    &epilogue, sizeof epilogue));
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &g.bias, sizeof g.bias));
  // The bias has C's type (cuBLASLt's default for these types, said explicitly).
  EMBER_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                    &data_type, sizeof data_type));

  // Layouts of the stored (column-major) matrices, before op().
  LtLayout a_layout, b_layout, c_layout;
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &a_layout.layout, data_type, op_a == CUBLAS_OP_N ? m : k, op_a == CUBLAS_OP_N ? k : m, ld_b));
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
      &b_layout.layout, data_type, op_b == CUBLAS_OP_N ? k : n, op_b == CUBLAS_OP_N ? n : k, ld_a));
  EMBER_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c_layout.layout, data_type, m, n, ld_c));

  const cublasLtHandle_t handle = lt_handle(g.device.index);
  const LtKey key{static_cast<int>(data_type),
                  static_cast<int>(compute_type),
                  static_cast<int>(op_a),
                  static_cast<int>(op_b),
                  static_cast<int>(m),
                  static_cast<int>(n),
                  static_cast<int>(k),
                  ld_a,
                  ld_b,
                  ld_c,
                  g.device.index,
                  align};
  LtAlgoCache& cache = lt_algo_cache();
  std::optional<cublasLtMatmulAlgo_t> algo;
  bool known = false;
  {
    std::lock_guard<std::mutex> lock(cache.mutex);
    const auto it = cache.algos.find(key);
    if (it != cache.algos.end()) {
      algo = it->second;
      known = true;
    }
  }
  if (!known) {
    LtPreference pref;
    EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref.pref));
    const uint64_t workspace = kLtWorkspaceBytes;
    EMBER_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    for (const auto attribute :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      EMBER_CUBLAS_CHECK(
          cublasLtMatmulPreferenceSetAttribute(pref.pref, attribute, &align, sizeof align));
    }
    cublasLtMatmulHeuristicResult_t result;
    std::memset(&result, 0, sizeof result);
    int found = 0;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, desc.desc, a_layout.layout, b_layout.layout, c_layout.layout, c_layout.layout,
        pref.pref, 1, &result, &found);
    if (status == CUBLAS_STATUS_SUCCESS && found > 0 && result.workspaceSize <= workspace) {
      algo = result.algo;
    }
    std::lock_guard<std::mutex> lock(cache.mutex);
    cache.algos.emplace(key, algo);
  }
  if (!algo.has_value()) return false;

  const Tensor workspace = cudnn_workspace(kLtWorkspaceBytes, g.device);
  const double zero_d = 0.0;
  const float zero_f = 0.0f;
  const void* beta = compute_type == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&zero_d)
                                                        : static_cast<const void*>(&zero_f);
  EMBER_CUBLAS_CHECK(cublasLtMatmul(handle, desc.desc, alpha, g.b, a_layout.layout, g.a,
                                    b_layout.layout, beta, g.c, c_layout.layout, g.c,
                                    c_layout.layout, &*algo, workspace.data_ptr(),
                                    kLtWorkspaceBytes, stream));
  return true;
}

void gemm_cuda(const GemmArgs& g) {
  EMBER_ASSERT(g.device.is_cuda(), "cuda gemm got a ", g.device.str(), " operand");
  EMBER_ASSERT(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  KernelContext ctx(g.device.index);
  EMBER_ASSERT(g.bias == nullptr || g.beta == 0.0, "cuda gemm: a bias epilogue with beta ", g.beta);
  if (g.k == 0 && g.bias != nullptr) {
    fill_rows_with_bias(g, ctx.stream);  // the empty product plus the bias
    return;
  }
  if (g.k == 0) {
    scale_empty_product(g, ctx.stream);
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
  // Without a cuBLASLt algorithm for the bias epilogue: C starts as the bias, beta 1.
  const double beta_value = g.bias != nullptr ? 1.0 : g.beta;
  const float alpha_f = static_cast<float>(g.alpha), beta_f = static_cast<float>(beta_value);
  const void* alpha = compute_type == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&g.alpha)
                                                         : static_cast<const void*>(&alpha_f);
  const void* beta = compute_type == CUBLAS_COMPUTE_64F ? static_cast<const void*>(&beta_value)
                                                        : static_cast<const void*>(&beta_f);
  // NOTE: GemmArgs is row-major and cuBLAS column-major. A row-major matrix read as
  // column-major is its transpose, so C^T = op(B)^T op(A)^T: swap A and B, and m and n.
  const int ld_b = g.trans_b ? blas_ld(g.ldb, g.n, g.k) : blas_ld(g.ldb, g.k, g.n);
  const int ld_a = g.trans_a ? blas_ld(g.lda, g.k, g.m) : blas_ld(g.lda, g.m, g.k);
  const int ld_c = blas_ld(g.ldc, g.m, g.n);
  if (g.bias != nullptr) {
    if (gemm_bias_lt(g, data_type, compute_type, alpha, ld_a, ld_b, ld_c, ctx.stream)) return;
    fill_rows_with_bias(g, ctx.stream);
  }
  BlasHandle& h = blas_handle(g.device.index);
  std::lock_guard<std::mutex> lock(h.mutex);
  EMBER_CUBLAS_CHECK(cublasSetStream(h.handle, ctx.stream));
  EMBER_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h.handle, g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      static_cast<int>(g.n), static_cast<int>(g.m), static_cast<int>(g.k), alpha, g.b, data_type,
      ld_b, g.stride_b, g.a, data_type, ld_a, g.stride_a, beta, g.c, data_type, ld_c, g.stride_c,
      static_cast<int>(g.batch), compute_type, CUBLAS_GEMM_DEFAULT));
}

#endif  // !EMBER_CUDA_EMULATED

// Fused linear's epilogue after the GEMM: out[r, j] = relu(in[r, j] + bias[j]) in one pass
// (bias null: relu alone), in the compute type and rounded once, NaN passing through as in
// relu.
template <typename T>
__global__ void bias_relu_kernel(T* out, const T* in, const T* bias, int64_t total, int64_t n) {
  using A = acc_t<T>;
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const A v = cast_to<A>(in[i]) + (bias != nullptr ? cast_to<A>(bias[i % n]) : A(0));
    out[i] = cast_to<T>(v < A(0) ? A(0) : v);
  }
}

void bias_activation_cuda(Activation activation, const Tensor& out, const Tensor& in,
                          const Tensor& bias) {
  EMBER_ASSERT(in.is_contiguous() && out.is_contiguous() && activation == Activation::kRelu);
  const int64_t n = in.dim() > 0 ? in.size(-1) : 1;
  if (in.numel() == 0 || n == 0) return;
  const KernelContext ctx(in);
  dispatch_floating(in.dtype(), "linear", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(in.numel()), kBlockSize, 0, ctx.stream, bias_relu_kernel<T>)
    (out.data_ptr<T>(), in.data_ptr<T>(), bias.defined() ? bias.data_ptr<T>() : nullptr, in.numel(),
     n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(linalg) {
#if !defined(EMBER_CUDA_EMULATED)
  table.gemm = gemm_cuda;
#endif
  table.bias_activation = bias_activation_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

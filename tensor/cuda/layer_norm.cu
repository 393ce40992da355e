// CUDA layer norm over rows [rows, n] (GPT layers); semantics match tensor/cpu/layer_norm.cpp.
//
// One warp per row: each lane folds a strided slice of the row and the warp combines the lanes
// with a butterfly of shuffles, the same order every time. The weight and bias gradients are
// column sums: blocks of 32 columns by chunks of rows write partial sums, and a second kernel
// adds the chunks in order, so no atomics are used and results do not depend on timing.
#include "../detail/dispatch.h"
#include "../ops.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;       // warps (rows) per block in the row kernels
constexpr int64_t kChunkRows = 128;    // rows per partial sum of the parameter gradients
constexpr int64_t kMaxChunks = 65535;  // gridDim.y limit

// The statistics type (mean/rstd) for inputs of type T.

// Every lane gets the sum of `value` over the warp.
template <typename A>
__device__ __forceinline__ A warp_sum(A value) {
#pragma unroll
  for (int mask = kWarp / 2; mask > 0; mask >>= 1)
    value += __shfl_xor_sync(0xffffffffu, value, mask);
  return value;
}

__device__ __forceinline__ double inverse_sqrt(double x) { return 1.0 / ::sqrt(x); }
__device__ __forceinline__ float inverse_sqrt(float x) { return 1.0f / ::sqrtf(x); }

// The rows a warp takes (the first, then every `step`) and the thread's lane in it.
struct WarpRows {
  int lane;
  int64_t first, step;
  __device__ WarpRows()
      : lane(threadIdx.x % kWarp),
        first(static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp),
        step(static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {}
};

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>(
      std::min<int64_t>((rows + kRowsPerBlock - 1) / kRowsPerBlock, kMaxGridBlocks));
}

template <typename T>
__global__ void layer_norm_forward_kernel(T* y, acc_t<T>* mean_out, acc_t<T>* rstd_out, const T* x,
                                          const T* weight, const T* bias, int64_t rows, int64_t n,
                                          double eps) {
  using A = acc_t<T>;
  const WarpRows warp;
  const int lane = warp.lane;
  for (int64_t r = warp.first; r < rows; r += warp.step) {
    const T* p = x + r * n;
    A sum = 0;
    for (int64_t j = lane; j < n; j += kWarp) sum += cast_to<A>(p[j]);
    const A m = warp_sum(sum) / static_cast<A>(n);
    A sq = 0;  // second pass over the (cached) row: no cancellation for large means
    for (int64_t j = lane; j < n; j += kWarp) {
      const A d = cast_to<A>(p[j]) - m;
      sq += d * d;
    }
    const A var = warp_sum(sq) / static_cast<A>(n);
    const acc_t<T> mean_r = static_cast<acc_t<T>>(m);
    const acc_t<T> rstd_r = static_cast<acc_t<T>>(inverse_sqrt(var + static_cast<A>(eps)));
    if (lane == 0) {
      mean_out[r] = mean_r;
      rstd_out[r] = rstd_r;
    }
    const A mr = static_cast<A>(mean_r), rr = static_cast<A>(rstd_r);
    T* q = y + r * n;
    for (int64_t j = lane; j < n; j += kWarp) {
      A v = (cast_to<A>(p[j]) - mr) * rr;
      if (weight != nullptr) v = v * cast_to<A>(weight[j]);
      if (bias != nullptr) v = v + cast_to<A>(bias[j]);
      q[j] = cast_to<T>(v);
    }
  }
}

template <typename T>
__global__ void layer_norm_input_grad_kernel(T* gx, const T* gy, const T* x, const T* weight,
                                             const acc_t<T>* mean, const acc_t<T>* rstd,
                                             int64_t rows, int64_t n) {
  using A = acc_t<T>;
  const WarpRows warp;
  const int lane = warp.lane;
  for (int64_t r = warp.first; r < rows; r += warp.step) {
    const T* p = x + r * n;
    const T* g = gy + r * n;
    const A m = static_cast<A>(mean[r]), rs = static_cast<A>(rstd[r]);
    A sum_g = 0, sum_gx = 0;  // sum(g * w) and sum(g * w * xhat)
    for (int64_t j = lane; j < n; j += kWarp) {
      const A w = weight != nullptr ? cast_to<A>(weight[j]) : A(1);
      const A gw = cast_to<A>(g[j]) * w;
      sum_g += gw;
      sum_gx += gw * (cast_to<A>(p[j]) - m) * rs;
    }
    const A c1 = warp_sum(sum_g) / static_cast<A>(n);
    const A c2 = warp_sum(sum_gx) / static_cast<A>(n);
    T* q = gx + r * n;
    for (int64_t j = lane; j < n; j += kWarp) {
      const A w = weight != nullptr ? cast_to<A>(weight[j]) : A(1);
      const A xhat = (cast_to<A>(p[j]) - m) * rs;
      q[j] = cast_to<T>(rs * (cast_to<A>(g[j]) * w - c1 - xhat * c2));
    }
  }
}

// partial[chunk, col] = sum(g * xhat) and partial[chunk, n + col] = sum(g) over the chunk's
// rows; block (32, kRowsPerBlock) covers 32 columns of one chunk.
template <typename T>
__global__ void layer_norm_param_partial_kernel(acc_t<T>* partial, const T* gy, const T* x,
                                                const acc_t<T>* mean, const acc_t<T>* rstd,
                                                int64_t rows, int64_t n, int64_t chunk_rows) {
  using A = acc_t<T>;
  EMBER_SHARED(A, shared_w, [kRowsPerBlock][kWarp]);
  EMBER_SHARED(A, shared_b, [kRowsPerBlock][kWarp]);
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kWarp + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t end = std::min(rows, (chunk + 1) * chunk_rows);
  A sum_w = 0, sum_b = 0;
  if (col < n) {
    for (int64_t r = chunk * chunk_rows + threadIdx.y; r < end; r += kRowsPerBlock) {
      const A g = cast_to<A>(gy[r * n + col]);
      sum_w += g * (cast_to<A>(x[r * n + col]) - static_cast<A>(mean[r])) * static_cast<A>(rstd[r]);
      sum_b += g;
    }
  }
  shared_w[threadIdx.y][threadIdx.x] = sum_w;
  shared_b[threadIdx.y][threadIdx.x] = sum_b;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    for (int k = 1; k < kRowsPerBlock; ++k) {
      sum_w += shared_w[k][threadIdx.x];
      sum_b += shared_b[k][threadIdx.x];
    }
    partial[chunk * 2 * n + col] = sum_w;
    partial[chunk * 2 * n + n + col] = sum_b;
  }
}

template <typename T>
__global__ void layer_norm_param_final_kernel(T* grad_weight, T* grad_bias, const acc_t<T>* partial,
                                              int64_t chunks, int64_t n) {
  using A = acc_t<T>;
  for (int64_t col = global_thread(); col < n; col += grid_stride()) {
    A sum_w = 0, sum_b = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      sum_w += partial[c * 2 * n + col];
      sum_b += partial[c * 2 * n + n + col];
    }
    if (grad_weight != nullptr) grad_weight[col] = cast_to<T>(sum_w);
    if (grad_bias != nullptr) grad_bias[col] = cast_to<T>(sum_b);
  }
}

// An optional tensor's data (null when undefined).
template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

void layer_norm_forward_cuda(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                             const Tensor& input, const Tensor& weight, const Tensor& bias,
                             double eps) {
  const int64_t rows = input.size(0), n = input.size(1);
  if (rows == 0 || n == 0) return;
  const KernelContext ctx(input);
  dispatch_floating(input.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(row_blocks(rows), kWarp * kRowsPerBlock, 0, ctx.stream,
                 layer_norm_forward_kernel<T>)
    (out.data_ptr<T>(), mean.data_ptr<acc_t<T>>(), rstd.data_ptr<acc_t<T>>(), input.data_ptr<T>(),
     data_or_null<T>(weight), data_or_null<T>(bias), rows, n, eps);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void layer_norm_backward_cuda(const Tensor& grad_input, const Tensor& grad_weight,
                              const Tensor& grad_bias, const Tensor& grad_out, const Tensor& input,
                              const Tensor& weight, const Tensor& mean, const Tensor& rstd) {
  const int64_t rows = input.size(0), n = input.size(1);
  if (rows == 0 || n == 0) return;
  const KernelContext ctx(input);
  dispatch_floating(input.dtype(), "layer_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const acc_t<T>* m = mean.data_ptr<acc_t<T>>();
    const acc_t<T>* rs = rstd.data_ptr<acc_t<T>>();
    if (grad_input.defined()) {
      EMBER_LAUNCH(row_blocks(rows), kWarp * kRowsPerBlock, 0, ctx.stream,
                   layer_norm_input_grad_kernel<T>)
      (grad_input.data_ptr<T>(), grad_out.data_ptr<T>(), input.data_ptr<T>(),
       data_or_null<T>(weight), m, rs, rows, n);
      EMBER_CUDA_CHECK_LAUNCH();
    }
    if (!grad_weight.defined() && !grad_bias.defined()) return;
    const int64_t chunk_rows = std::max(kChunkRows, (rows + kMaxChunks - 1) / kMaxChunks);
    const int64_t chunks = (rows + chunk_rows - 1) / chunk_rows;
    const Tensor partial = empty({chunks, 2 * n}, TensorOptions(dtype_of<A>, input.device()));
    const dim3 grid(static_cast<unsigned>((n + kWarp - 1) / kWarp), static_cast<unsigned>(chunks));
    EMBER_LAUNCH(grid, dim3(kWarp, kRowsPerBlock), 0, ctx.stream,
                 layer_norm_param_partial_kernel<T>)
    (partial.data_ptr<A>(), grad_out.data_ptr<T>(), input.data_ptr<T>(), m, rs, rows, n,
     chunk_rows);
    EMBER_CUDA_CHECK_LAUNCH();
    EMBER_LAUNCH(grid_for(n), kBlockSize, 0, ctx.stream, layer_norm_param_final_kernel<T>)
    (data_or_null<T>(grad_weight), data_or_null<T>(grad_bias), partial.data_ptr<A>(), chunks, n);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(layer_norm) {
  table.layer_norm_forward = layer_norm_forward_cuda;
  table.layer_norm_backward = layer_norm_backward_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

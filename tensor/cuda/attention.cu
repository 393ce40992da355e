// CUDA scaled-dot-product attention. Two kernels: the tensor-core one (attention_tc.cu, after
// FlashAttention-2) for f16/bf16 at head dims 64 and 128, and the simple one below for every
// other call; see the dispatch at the bottom of this file for how one is picked.
//
// The simple kernel: ember's own, written for clarity over speed.
// One warp owns one output row and walks the keys (or, for dk/dv, the queries) 32 at a time:
// each lane scores one of them (a full dot product), the warp combines the 32 scores (online
// softmax in forward), and each lane then accumulates its own columns of the row in shared
// memory, the 32 weights broadcast by shuffles. The causal mask ends each walk at the
// diagonal, so masked blocks are never visited. Compute type A: float for f32/f16/bf16,
// double for f64; the logsumexp is saved in A. No atomics: results do not depend on timing.
// Backward: D = rowsum(dO * O), then one kernel for dq (a warp per query row) and one for
// dk and dv (a warp per key row), both recomputing the weights from the saved logsumexp.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "../detail/attention.h"
#include "../detail/dispatch.h"
#include "../ops.h"
#include "attention_tc.cuh"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

constexpr int kWarp = 32;
constexpr int kMaxWarpsPerBlock = 4;
constexpr size_t kMaxSharedBytes = 48 * 1024;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
  for (int mask = kWarp / 2; mask > 0; mask >>= 1) v += __shfl_xor_sync(kFullMask, v, mask);
  return v;
}

template <typename A>
__device__ __forceinline__ A warp_max(A v) {
#pragma unroll
  for (int mask = kWarp / 2; mask > 0; mask >>= 1) {
    const A other = __shfl_xor_sync(kFullMask, v, mask);
    v = other > v ? other : v;
  }
  return v;
}

// a . b over n elements, a in shared memory (A), b in global memory (T).
template <typename T, typename A>
__device__ __forceinline__ A dot(const A* a, const T* b, int64_t n) {
  A total = 0;
  for (int64_t c = 0; c < n; ++c) total += a[c] * cast_to<A>(b[c]);
  return total;
}

// acc[c] += scale * sum_t w_t * rows[t * ld + c] for the lane's columns c, over the n <= 32
// rows of a chunk whose weights w_t lane t holds; every lane of the warp must call it.
template <typename T, typename A>
__device__ __forceinline__ void accumulate_rows(A* acc, A w, const T* rows, int n, int64_t width,
                                                int64_t ld, A scale) {
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (int64_t c0 = 0; c0 < width; c0 += kWarp) {
    const int64_t c = c0 + lane;
    A total = 0;
    for (int t = 0; t < n; ++t) {
      const A wt = __shfl_sync(kFullMask, w, t);
      if (c < width) total += wt * cast_to<A>(rows[t * ld + c]);
    }
    if (c < width) acc[c] += scale * total;
  }
}

// The warp's shared row dst = src (n values, as A), or zeros.
template <typename T, typename A>
__device__ __forceinline__ void load_row(A* dst, const T* src, int64_t n) {
  for (int64_t c = threadIdx.x % kWarp; c < n; c += kWarp) dst[c] = cast_to<A>(src[c]);
}
template <typename A>
__device__ __forceinline__ void zero_row(A* dst, int64_t n) {
  for (int64_t c = threadIdx.x % kWarp; c < n; c += kWarp) dst[c] = A(0);
}

struct Geometry {
  int64_t bh, lq, lk, e, ev;
};

// The keys query i sees: all, or (causal) those up to and including i.
__device__ __forceinline__ int64_t key_end_of(const Geometry& g, int64_t i, bool causal) {
  return causal && i + 1 < g.lk ? i + 1 : g.lk;
}

// How many of the rows from `first` on fall in a chunk of one warp.
__device__ __forceinline__ int chunk_rows(int64_t first, int64_t end) {
  return end - first < kWarp ? static_cast<int>(end - first) : kWarp;
}

// The dropout factor of weight `index`: 0 or 1 / (1 - p); 1 without dropout.
template <typename A>
struct Dropout {
  bool on;
  uint64_t seed, offset;
  float keep;
  A rescale;
  __device__ __forceinline__ A factor(uint64_t index) const {
    if (!on) return A(1);
    return attention_keep(seed, offset, index, keep) ? rescale : A(0);
  }
};

template <typename A>
Dropout<A> dropout_of(const AttentionParams& p) {
  return {p.dropout_p > 0.0, p.seed, p.offset, static_cast<float>(1.0 - p.dropout_p),
          p.dropout_p < 1.0 ? static_cast<A>(1.0 / (1.0 - p.dropout_p)) : A(0)};
}

template <typename T, typename A>
__global__ void forward_kernel(T* out, A* lse, const T* q, const T* k, const T* v, Geometry g,
                               A scale, bool causal, Dropout<A> drop) {
  EMBER_DYNAMIC_SHARED(unsigned char, shared_bytes);
  const int warp = static_cast<int>(threadIdx.x / kWarp),
            lane = static_cast<int>(threadIdx.x % kWarp);
  A* qs = reinterpret_cast<A*>(shared_bytes) + warp * (g.e + g.ev);
  A* acc = qs + g.e;
  const int64_t warps = static_cast<int64_t>(blockDim.x) / kWarp;
  for (int64_t row = blockIdx.x * warps + warp; row < g.bh * g.lq; row += gridDim.x * warps) {
    const int64_t b = row / g.lq, i = row % g.lq;
    __syncwarp();  // the previous row's reads of qs are done
    load_row(qs, q + row * g.e, g.e);
    zero_row(acc, g.ev);
    __syncwarp();
    const int64_t key_end = key_end_of(g, i, causal);
    const T* kb = k + b * g.lk * g.e;
    const T* vb = v + b * g.lk * g.ev;
    A m = -INFINITY, l = 0;
    for (int64_t j0 = 0; j0 < key_end; j0 += kWarp) {
      const int64_t j = j0 + lane;
      const A s = j < key_end ? scale * dot(qs, kb + j * g.e, g.e) : A(-INFINITY);
      const A mx = ::max(m, warp_max(s));
      if (mx == A(-INFINITY)) continue;  // the same on every lane
      const A corr = ::exp(m - mx);
      const A w = j < key_end ? ::exp(s - mx) : A(0);
      l = l * corr + warp_sum(w);
      m = mx;
      for (int64_t c = lane; c < g.ev; c += kWarp) acc[c] *= corr;
      const A dropped = j < key_end ? w * drop.factor(static_cast<uint64_t>(row * g.lk + j)) : A(0);
      accumulate_rows(acc, dropped, vb + j0 * g.ev, chunk_rows(j0, key_end), g.ev, g.ev, A(1));
    }
    const A inv = l > A(0) ? A(1) / l : A(0);
    for (int64_t c = lane; c < g.ev; c += kWarp) out[row * g.ev + c] = cast_to<T>(acc[c] * inv);
    if (lane == 0) lse[row] = m + ::log(l);
  }
}

// dsum[row] = rowsum(grad_out * out).
template <typename T, typename A>
__global__ void row_dot_kernel(A* dsum, const T* go, const T* o, int64_t rows, int64_t ev) {
  const int64_t warps = static_cast<int64_t>(blockDim.x) / kWarp;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  for (int64_t row = blockIdx.x * warps + threadIdx.x / kWarp; row < rows;
       row += gridDim.x * warps) {
    A total = 0;
    for (int64_t c = lane; c < ev; c += kWarp) {
      total += cast_to<A>(go[row * ev + c]) * cast_to<A>(o[row * ev + c]);
    }
    total = warp_sum(total);
    if (lane == 0) dsum[row] = total;
  }
}

// dq for one query row per warp: dq = scale * sum_j dS_ij k_j.
template <typename T, typename A>
__global__ void grad_q_kernel(T* gq, const T* go, const T* q, const T* k, const T* v, const A* lse,
                              const A* dsum, Geometry g, A scale, bool causal, Dropout<A> drop) {
  EMBER_DYNAMIC_SHARED(unsigned char, shared_bytes);
  const int warp = static_cast<int>(threadIdx.x / kWarp),
            lane = static_cast<int>(threadIdx.x % kWarp);
  A* qs = reinterpret_cast<A*>(shared_bytes) + warp * (2 * g.e + g.ev);
  A* gos = qs + g.e;
  A* acc = gos + g.ev;
  const int64_t warps = static_cast<int64_t>(blockDim.x) / kWarp;
  for (int64_t row = blockIdx.x * warps + warp; row < g.bh * g.lq; row += gridDim.x * warps) {
    const int64_t b = row / g.lq, i = row % g.lq;
    __syncwarp();
    load_row(qs, q + row * g.e, g.e);
    load_row(gos, go + row * g.ev, g.ev);
    zero_row(acc, g.e);
    __syncwarp();
    const int64_t key_end = key_end_of(g, i, causal);
    const T* kb = k + b * g.lk * g.e;
    const T* vb = v + b * g.lk * g.ev;
    for (int64_t j0 = 0; j0 < key_end; j0 += kWarp) {
      const int64_t j = j0 + lane;
      A ds = 0;
      if (j < key_end) {
        const A w = ::exp(scale * dot(qs, kb + j * g.e, g.e) - lse[row]);
        const A dp =
            dot(gos, vb + j * g.ev, g.ev) * drop.factor(static_cast<uint64_t>(row * g.lk + j));
        ds = w * (dp - dsum[row]);
      }
      accumulate_rows(acc, ds, kb + j0 * g.e, chunk_rows(j0, key_end), g.e, g.e, scale);
    }
    for (int64_t c = lane; c < g.e; c += kWarp) gq[row * g.e + c] = cast_to<T>(acc[c]);
  }
}

// dk and dv for one key row per warp: dv = sum_i P~_ij dO_i, dk = scale * sum_i dS_ij q_i.
template <typename T, typename A>
__global__ void grad_kv_kernel(T* gk, T* gv, const T* go, const T* q, const T* k, const T* v,
                               const A* lse, const A* dsum, Geometry g, A scale, bool causal,
                               Dropout<A> drop) {
  EMBER_DYNAMIC_SHARED(unsigned char, shared_bytes);
  const int warp = static_cast<int>(threadIdx.x / kWarp),
            lane = static_cast<int>(threadIdx.x % kWarp);
  A* ks = reinterpret_cast<A*>(shared_bytes) + warp * 2 * (g.e + g.ev);
  A* vs = ks + g.e;
  A* dk = vs + g.ev;
  A* dv = dk + g.e;
  const int64_t warps = static_cast<int64_t>(blockDim.x) / kWarp;
  for (int64_t row = blockIdx.x * warps + warp; row < g.bh * g.lk; row += gridDim.x * warps) {
    const int64_t b = row / g.lk, j = row % g.lk;
    __syncwarp();
    load_row(ks, k + row * g.e, g.e);
    load_row(vs, v + row * g.ev, g.ev);
    zero_row(dk, g.e);
    zero_row(dv, g.ev);
    __syncwarp();
    const T* qb = q + b * g.lq * g.e;
    const T* gob = go + b * g.lq * g.ev;
    for (int64_t i0 = causal ? j : 0; i0 < g.lq; i0 += kWarp) {
      const int64_t i = i0 + lane;
      A dropped = 0, ds = 0;
      if (i < g.lq) {
        const int64_t qrow = b * g.lq + i;
        const A w = ::exp(scale * dot(ks, qb + i * g.e, g.e) - lse[qrow]);
        const A z = drop.factor(static_cast<uint64_t>(qrow * g.lk + j));
        dropped = w * z;
        ds = w * (dot(vs, gob + i * g.ev, g.ev) * z - dsum[qrow]);
      }
      const int n = chunk_rows(i0, g.lq);
      accumulate_rows(dv, dropped, gob + i0 * g.ev, n, g.ev, g.ev, A(1));
      accumulate_rows(dk, ds, qb + i0 * g.e, n, g.e, g.e, scale);
    }
    for (int64_t c = lane; c < g.e; c += kWarp) gk[row * g.e + c] = cast_to<T>(dk[c]);
    for (int64_t c = lane; c < g.ev; c += kWarp) gv[row * g.ev + c] = cast_to<T>(dv[c]);
  }
}

// Launch shape for `rows` warps needing `per_warp` bytes of shared memory each.
struct Launch {
  unsigned grid;
  unsigned block;
  size_t shared;
};

Launch launch_for(int64_t rows, size_t per_warp, const Geometry& g) {
  EMBER_CHECK(per_warp <= kMaxSharedBytes, "scaled_dot_product_attention", "head sizes E = ", g.e,
              " and E_v = ", g.ev, " are too large for the CUDA kernel's shared memory (", per_warp,
              " bytes per row, ", kMaxSharedBytes, " available)");
  const int64_t fit = per_warp == 0 ? kMaxWarpsPerBlock : kMaxSharedBytes / per_warp;
  const int64_t warps = std::clamp<int64_t>(fit, 1, kMaxWarpsPerBlock);
  const int64_t blocks = std::min<int64_t>((rows + warps - 1) / warps, kMaxGridBlocks);
  return {static_cast<unsigned>(std::max<int64_t>(blocks, 1)), static_cast<unsigned>(warps * kWarp),
          static_cast<size_t>(warps) * per_warp};
}

Geometry geometry_of(const Tensor& q, const Tensor& v) {
  return {q.size(0), q.size(1), v.size(1), q.size(2), v.size(2)};
}

// Which kernel runs a call, chosen by measurement: EMBER_SDPA_CUDA_KERNEL=simple keeps every
// call on the simple kernel above; tensor_core (also when unset or empty) sends the calls the
// tensor-core kernel supports (attention_tc_supported: f16/bf16, E = Ev in {64, 128}, aligned
// rows, compute capability 8.0+) there and the rest here. The variable is read at every call,
// so a benchmark or a test can time or compare both in one process. Forward and backward
// choose independently: both kernels save and read the same out and logsumexp.
bool use_tensor_core_kernel(const Tensor& q, const Tensor& k, const Tensor& v,
                            std::initializer_list<const Tensor*> others) {
  const char* choice = std::getenv("EMBER_SDPA_CUDA_KERNEL");
  if (choice != nullptr && std::strcmp(choice, "simple") == 0) return false;
  EMBER_CHECK(choice == nullptr || choice[0] == '\0' || std::strcmp(choice, "tensor_core") == 0,
              "scaled_dot_product_attention", "EMBER_SDPA_CUDA_KERNEL must be simple or ",
              "tensor_core, got '", choice, "'");
  return attention_tc_supported(q, k, v, others);
}

void attention_forward_cuda(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                            const Tensor& v, const AttentionParams& params) {
  EMBER_ASSERT(out.is_contiguous() && lse.is_contiguous() && q.is_contiguous() &&
               k.is_contiguous() && v.is_contiguous());
  const Geometry g = geometry_of(q, v);
  if (g.bh * g.lq == 0) return;
  if (use_tensor_core_kernel(q, k, v, {&out})) {
    attention_tc_forward(out, lse, q, k, v, params);
    return;
  }
  const KernelContext ctx(q);
  dispatch_floating(q.dtype(), "scaled_dot_product_attention", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const Launch l = launch_for(g.bh * g.lq, sizeof(A) * static_cast<size_t>(g.e + g.ev), g);
    EMBER_LAUNCH(l.grid, l.block, l.shared, ctx.stream, forward_kernel<T, A>)
    (out.data_ptr<T>(), lse.data_ptr<A>(), q.data_ptr<T>(), k.data_ptr<T>(), v.data_ptr<T>(), g,
     static_cast<A>(params.scale), params.causal, dropout_of<A>(params));
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

void attention_backward_cuda(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                             const Tensor& grad_out, const Tensor& q, const Tensor& k,
                             const Tensor& v, const Tensor& out, const Tensor& lse,
                             const AttentionParams& params) {
  EMBER_ASSERT(grad_out.is_contiguous() && out.is_contiguous() && lse.is_contiguous() &&
               q.is_contiguous() && k.is_contiguous() && v.is_contiguous());
  const Geometry g = geometry_of(q, v);
  if (use_tensor_core_kernel(q, k, v, {&grad_out, &out, &grad_q, &grad_k, &grad_v})) {
    attention_tc_backward(grad_q, grad_k, grad_v, grad_out, q, k, v, out, lse, params);
    return;
  }
  const KernelContext ctx(q);
  dispatch_floating(q.dtype(), "scaled_dot_product_attention_backward", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const Tensor dsum = empty({g.bh * g.lq}, lse.options());
    const Dropout<A> drop = dropout_of<A>(params);
    const A scale = static_cast<A>(params.scale);
    if (g.bh * g.lq > 0) {
      const Launch l = launch_for(g.bh * g.lq, 0, g);
      EMBER_LAUNCH(l.grid, l.block, 0, ctx.stream, row_dot_kernel<T, A>)
      (dsum.data_ptr<A>(), grad_out.data_ptr<T>(), out.data_ptr<T>(), g.bh * g.lq, g.ev);
      EMBER_CUDA_CHECK_LAUNCH();
      const Launch lq = launch_for(g.bh * g.lq, sizeof(A) * static_cast<size_t>(2 * g.e + g.ev), g);
      EMBER_LAUNCH(lq.grid, lq.block, lq.shared, ctx.stream, grad_q_kernel<T, A>)
      (grad_q.data_ptr<T>(), grad_out.data_ptr<T>(), q.data_ptr<T>(), k.data_ptr<T>(),
       v.data_ptr<T>(), lse.data_ptr<A>(), dsum.data_ptr<A>(), g, scale, params.causal, drop);
      EMBER_CUDA_CHECK_LAUNCH();
    }
    if (g.bh * g.lk > 0) {
      const Launch lk =
          launch_for(g.bh * g.lk, sizeof(A) * static_cast<size_t>(2 * (g.e + g.ev)), g);
      EMBER_LAUNCH(lk.grid, lk.block, lk.shared, ctx.stream, grad_kv_kernel<T, A>)
      (grad_k.data_ptr<T>(), grad_v.data_ptr<T>(), grad_out.data_ptr<T>(), q.data_ptr<T>(),
       k.data_ptr<T>(), v.data_ptr<T>(), lse.data_ptr<A>(), dsum.data_ptr<A>(), g, scale,
       params.causal, drop);
      EMBER_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(attention) {
  table.attention_forward = &attention_forward_cuda;
  table.attention_backward = &attention_backward_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

// Tensor-core scaled-dot-product attention for f16/bf16 and head dims 64 and 128 (sm_80+),
// after FlashAttention-2. This header holds the kernel bodies, written against a small
// execution context `ctx` (thread index, block barrier, warp shuffle, ldmatrix.x4 and
// mma.m16n8k16), so the same code runs on the GPU (attention_tc.cu, one CUDA block per call of
// a body) and on the CPU with an emulated block (tests/tensor/attention_tc_test.cpp checks it
// there). Private to tensor/cuda/.
//
// Tiling. A block is kThreads = 128 threads, 4 warps; every matrix product is a sequence of
// mma.m16n8k16 (16x16 bf16/f16 A times 16x8 B into 16x8 f32 C) whose fragments follow the
// PTX ISA's layouts (g = lane / 4, t = lane % 4):
//   A (16x16): reg0 = (g, 2t..2t+1), reg1 = (g+8, 2t..), reg2 = (g, 2t+8..), reg3 = (g+8, 2t+8..)
//   B (16x8):  reg0 = (k 2t..2t+1, n g), reg1 = (k 2t+8..2t+9, n g)
//   C (16x8):  c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
// so the C fragments of two neighbouring 16x8 score tiles are, packed in pairs, the A
// fragment of the 16x16 tile they form: probabilities never leave registers.
//   forward:  a block owns 4 warps x 16 M query rows of one batch-head (M = 2 m-tiles per warp
//     at D 64, so every B fragment read from shared memory feeds two mma; 1 at D 128, where
//     registers run out), with the warp's Q fragments in registers; it walks the keys in tiles
//     (32 keys at D 64, 64 at D 128) through two shared-memory stages, tile t + 1 arriving by
//     cp.async while tile t is computed (rows padded by 8 elements so each ldmatrix phase
//     reads 8 rows from 32 different banks; B fragments by ldmatrix, V's transposed on the
//     way): S = Q K^T in f32, scaled to log2 units, causal and tail columns set to -inf before
//     the row maximum on the tiles that cross the diagonal or an end (shuffles across the 4
//     lanes that share a row), online softmax (running max m, sum l), P (dropped out when
//     asked) rounded to 16 bits as the A operand of O += P V. At the end O / l is rounded once
//     to T and lse = m ln 2 + ln l is saved per row (f32).
//   backward: D = rowsum(dO * O) first (row_dot_block); then two kernels, no atomics, so the
//     result does not depend on timing:
//     dq:   as the forward (kDqTiles m-tiles per warp, now 1: 64 query rows per block; Q and
//           dO fragments in registers; key tiles of 64 keys at D 64, 32 at D 128, two stages):
//           P = exp2(S - lse), dP = dO V^T, dS = P * (dP * z - D), dQ += dS K; dQ * scale
//           stored once.
//     dk/dv: a block owns 64 keys (16 per warp, K and V in shared memory) and walks query
//           tiles (64 queries at D 64, 32 at D 128; Q, dO, lse, D through two shared-memory
//           stages by cp.async): S^T = K Q^T, dP^T = V dO^T, dV += (P * z)^T dO,
//           dK += dS^T Q; dK * scale stored once.
//   Causal blocks stop at the diagonal (and warps skip tiles wholly above it); rows and keys
//   past the ends load as zeros and are masked, never stored. Dropout (a separate
//   instantiation, kDropout): the factor of weight (b, i, j) is attention_keep(seed, offset,
//   (b Lq + i) Lk + j) as on the CPU (attention.h), drawn per tile into a bit mask.
//   Shared memory per block (D 64 / D 128): forward 18 / 68 KiB, dq 36 / 34 KiB, dk/dv 55 /
//   69 KiB; attention_tc.cu raises a kernel's limit where it needs more than 48 KiB.
#pragma once

#include <math.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "../detail/attention.h"
#include "../dtype.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define EMBER_TC_FN __device__ __forceinline__
#else
#define EMBER_TC_FN inline
#endif

namespace ember::detail::attention_tc {

constexpr int kThreads = 128;   // 4 warps
constexpr int kWarpRows = 16;   // rows (queries, or keys for dk/dv) per warp
constexpr int kBlockRows = 64;  // keys per dk/dv block
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory row stride of a tile, in elements: 16 bytes of padding per row.
template <int D>
constexpr int kLd = D + 8;
// Query rows per warp in the forward, in 16-row m-tiles: two at D 64, so that every B
// fragment read from shared memory feeds two mma (registers allow one at D 128).
template <int D>
constexpr int kForwardTiles = D <= 64 ? 2 : 1;
template <int D>
constexpr int kForwardRows = D <= 64 ? 128 : 64;  // per block: 4 warps x 16 x kForwardTiles
template <int D>
constexpr int kForwardKeys = D <= 64 ? 32 : 64;  // per key tile
// The dq kernel likewise: m-tiles per warp, rows per block, and keys per tile (registers
// bound them); queries per tile of the dk/dv kernel.
template <int D>
constexpr int kDqTiles = 1;
template <int D>
constexpr int kDqRows = 64;  // per block: 4 warps x 16 x kDqTiles
template <int D>
constexpr int kDqKeys = D <= 64 ? 64 : 32;
template <int D>
constexpr int kDkvQueries = D <= 64 ? 64 : 32;

template <int D>
constexpr size_t forward_smem_bytes() {
  return 2 * 2 * kForwardKeys<D> * kLd<D> * sizeof(uint16_t);  // two stages of K and V tiles
}
template <int D>
constexpr size_t grad_q_smem_bytes() {
  return 2 * 2 * kDqKeys<D> * kLd<D> * sizeof(uint16_t);  // two stages of K and V tiles
}
template <int D>
constexpr size_t grad_kv_smem_bytes() {
  // The block's K and V; two stages of a Q and a dO tile with the tile's lse and D.
  return 2 * kBlockRows * kLd<D> * sizeof(uint16_t) +
         2 * (2 * kDkvQueries<D> * kLd<D> * sizeof(uint16_t) + 2 * kDkvQueries<D> * sizeof(float));
}
constexpr int kRowDotRows = kThreads / 8;  // row_dot_block: 8 threads per row

// One call's geometry and pointers; tensors are contiguous [bh, rows, D].
struct Params {
  const void* q;
  const void* k;
  const void* v;
  void* out;   // forward: [bh, lq, D]
  float* lse;  // forward writes, backward reads: [bh, lq], natural log
  const void* grad_out;
  float* dsum;  // backward: rowsum(dO * O), [bh, lq]
  void* grad_q;
  void* grad_k;
  void* grad_v;
  int64_t bh, lq, lk;
  float scale;       // softmax scale
  float scale_log2;  // scale * log2(e)
  bool causal;
  bool dropout;  // (the bodies take it as their kDropout template argument)
  uint64_t seed, offset;
  float keep;     // float(1 - p)
  float rescale;  // 1 / (1 - p), 0 at p = 1
};

// The scalars of a call (pointers left null): bh batch-heads, lq queries, lk keys.
inline Params params_for(const AttentionParams& a, int64_t bh, int64_t lq, int64_t lk) {
  Params p{};
  p.bh = bh;
  p.lq = lq;
  p.lk = lk;
  p.scale = static_cast<float>(a.scale);
  p.scale_log2 = static_cast<float>(a.scale * 1.4426950408889634);
  p.causal = a.causal;
  p.dropout = a.dropout_p > 0.0;
  p.seed = a.seed;
  p.offset = a.offset;
  p.keep = static_cast<float>(1.0 - a.dropout_p);
  p.rescale = a.dropout_p < 1.0 ? static_cast<float>(1.0 / (1.0 - a.dropout_p)) : 0.0f;
  return p;
}

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks per launch of each body.
template <int D>
int64_t forward_blocks(const Params& p) {
  return p.bh * ceil_div(p.lq, kForwardRows<D>);
}
template <int D>
int64_t grad_q_blocks(const Params& p) {
  return p.bh * ceil_div(p.lq, kDqRows<D>);
}
inline int64_t grad_kv_blocks(const Params& p) { return p.bh * ceil_div(p.lk, kBlockRows); }
inline int64_t row_dot_blocks(const Params& p) { return ceil_div(p.bh * p.lq, kRowDotRows); }

// ---------------------------------------------------------------------------------------
// Register and memory helpers. 16-bit elements travel as raw bits (uint16_t).

EMBER_TC_FN uint32_t load_u32(const uint16_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}

EMBER_TC_FN void store_u32(uint16_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(p, &v, sizeof(v));
#endif
}

// 16 bytes (8 elements) from src to dst.
EMBER_TC_FN void copy16(uint16_t* dst, const uint16_t* src) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#else
  std::memcpy(dst, src, 16);
#endif
}

EMBER_TC_FN uint32_t pack_bits(uint16_t lo, uint16_t hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}

// Two floats rounded to T (nearest even), `lo` in the low half (the lower column).
template <typename T>
EMBER_TC_FN uint32_t pack_floats(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, BFloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
#else
  return pack_bits(T::from_float(lo), T::from_float(hi));
#endif
}

template <typename T>
EMBER_TC_FN float to_float(uint16_t bits) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<T, BFloat16>) {
    return __bfloat162float(__ushort_as_bfloat16(bits));
  } else {
    return __half2float(__ushort_as_half(bits));
  }
#else
  return T::to_float(bits);
#endif
}

// The fragments of one warp. g = lane / 4, t = lane % 4.
struct Lane {
  int g, t;
};

// A from global memory: rows r0 .. r0 + 15 of an [n, ld] matrix, rows >= n as zeros.
EMBER_TC_FN void load_a_rows(uint32_t (&a)[4], const uint16_t* base, int ld, int64_t r0, int c0,
                             int64_t n, Lane ln) {
  const int64_t lo = r0 + ln.g, hi = lo + 8;
  const int c = c0 + 2 * ln.t;
  a[0] = lo < n ? load_u32(base + lo * ld + c) : 0u;
  a[1] = hi < n ? load_u32(base + hi * ld + c) : 0u;
  a[2] = lo < n ? load_u32(base + lo * ld + c + 8) : 0u;
  a[3] = hi < n ? load_u32(base + hi * ld + c + 8) : 0u;
}

// Fragments from shared memory with ldmatrix.x4 (ctx.ldsm / ctx.ldsm_t): lane l gives the
// address of row l % 8 of 8x8 matrix l / 8 (16 aligned bytes); register i of every lane then
// holds matrix i's (row g, columns 2t, 2t + 1), or with .trans its (rows 2t, 2t + 1, column g).
// s is a row-major tile with row stride ld; `lane` is the lane index.

// A: the 16x16 block at (r0, c0). Matrices: rows r0 / r0 + 8 (i % 2), columns c0 / c0 + 8
// (i / 2), so the registers are A's reg0 .. reg3.
template <typename Ctx>
EMBER_TC_FN void ldsm_a(const Ctx& ctx, uint32_t (&a)[4], const uint16_t* s, int ld, int r0, int c0,
                        int lane) {
  const int i = lane / 8;
  ctx.ldsm(a, s + (r0 + (i % 2) * 8 + lane % 8) * ld + c0 + (i / 2) * 8);
}

// Two B fragments (n-tiles n0 and n0 + 8, k from k0 to k0 + 15) where the tile holds B's
// transpose: B[k][n] = s[n][k] (the keys of S = Q K^T). Matrices: columns k0 / k0 + 8
// (i % 2), rows n0 / n0 + 8 (i / 2), so b[j] = {reg 2j, reg 2j + 1} is n-tile n0 + 8j.
template <typename Ctx>
EMBER_TC_FN void ldsm_b_t(const Ctx& ctx, uint32_t (&b)[2][2], const uint16_t* s, int ld, int n0,
                          int k0, int lane) {
  const int i = lane / 8;
  uint32_t r[4];
  ctx.ldsm(r, s + (n0 + (i / 2) * 8 + lane % 8) * ld + k0 + (i % 2) * 8);
  b[0][0] = r[0];
  b[0][1] = r[1];
  b[1][0] = r[2];
  b[1][1] = r[3];
}

// Two B fragments (n-tiles n0 and n0 + 8, k from k0 to k0 + 15) of a tile holding B itself:
// B[k][n] = s[k][n] (the values of O = P V), transposed on the way. Matrices: rows k0 / k0 + 8
// (i % 2), columns n0 / n0 + 8 (i / 2).
template <typename Ctx>
EMBER_TC_FN void ldsm_b(const Ctx& ctx, uint32_t (&b)[2][2], const uint16_t* s, int ld, int k0,
                        int n0, int lane) {
  const int i = lane / 8;
  uint32_t r[4];
  ctx.ldsm_t(r, s + (k0 + (i % 2) * 8 + lane % 8) * ld + n0 + (i / 2) * 8);
  b[0][0] = r[0];
  b[0][1] = r[1];
  b[1][0] = r[2];
  b[1][1] = r[3];
}

// The A fragment of columns 16 kk .. 16 kk + 15 of a 16-row f32 C tile set (n-tiles of 8
// columns), rounded to T.
template <typename T, int N>
EMBER_TC_FN void c_to_a(uint32_t (&a)[4], const float (&c)[N][4], int kk) {
  a[0] = pack_floats<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = pack_floats<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = pack_floats<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = pack_floats<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// rows [row0, row0 + rows) of an [n, D] row-major matrix into shared memory (row stride
// kLd<D>), 16 bytes per thread per step, by cp.async (ctx.copy16_async): the copies land
// once the thread's group is waited for (ctx.commit, ctx.wait_newest_pending) and a block
// barrier has passed. Rows at or past n become zeros.
template <int D, typename Ctx>
EMBER_TC_FN void load_tile_async(const Ctx& ctx, uint16_t* dst, const uint16_t* src, int64_t row0,
                                 int rows, int64_t n) {
  constexpr int kChunks = D / 8;
  for (int c = ctx.thread(); c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool in = row0 + r < n;
    ctx.copy16_async(dst + r * kLd<D> + col, in ? src + (row0 + r) * D + col : src, in);
  }
}

// n floats src[row0 ..] into dst with cp.async (4 bytes each), rows at or past `end` as 0.
template <typename Ctx>
EMBER_TC_FN void load_floats_async(const Ctx& ctx, float* dst, const float* src, int64_t row0,
                                   int n, int64_t end) {
  for (int c = ctx.thread(); c < n; c += kThreads) {
    const bool in = row0 + c < end;
    ctx.copy4_async(dst + c, in ? src + row0 + c : src, in);
  }
}

// Dropout: the kept bits of the 4 N weights a lane holds in N C tiles, bit 4 n + e for element
// e of tile n; index(h, c) is the flat weight index ((b Lq + i) Lk + j, attention.h) of the
// lane's row half h (row g or g + 8) and tile column c. A rolled loop, so the unrolled
// softmax code stays small and the draws take few registers.
template <int N, typename Index>
EMBER_TC_FN uint32_t keep_bits(const Params& p, Lane ln, const Index& index) {
  static_assert(4 * N <= 32, "one bit per element in a 32-bit mask");
  uint32_t bits = 0;
#pragma unroll 1
  for (int x = 0; x < 4 * N; ++x) {
    const int c = 8 * (x / 4) + 2 * ln.t + x % 2;
    if (attention_keep(p.seed, p.offset, index((x % 4) / 2, c), p.keep)) bits |= 1u << x;
  }
  return bits;
}

// The dropout factor of bit x of `keep`: 1 / (1 - p) or 0.
EMBER_TC_FN float keep_factor(const Params& p, uint32_t keep, int x) {
  return (keep >> x) & 1u ? p.rescale : 0.0f;
}

// 2^x; -inf gives 0. On the GPU the special-function unit's approximation (ex2.approx, about
// 2 ulp), as FlashAttention's fast-math build uses.
EMBER_TC_FN float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Row maximum and sum across the 4 lanes (t = 0..3) that hold one row.
template <typename Ctx>
EMBER_TC_FN float quad_max(const Ctx& ctx, float v) {
  v = fmaxf(v, ctx.shfl_xor(v, 1));
  return fmaxf(v, ctx.shfl_xor(v, 2));
}
template <typename Ctx>
EMBER_TC_FN float quad_sum(const Ctx& ctx, float v) {
  v += ctx.shfl_xor(v, 1);
  return v + ctx.shfl_xor(v, 2);
}

// For query row i and the key tile starting at j0 (`cols` keys): how many of the tile's
// columns the row sees (it sees columns c < that), in [0, cols].
EMBER_TC_FN int seen_columns(const Params& p, int64_t i, int64_t j0, int cols) {
  int64_t end = p.lk - j0;
  if (p.causal && i - j0 + 1 < end) end = i - j0 + 1;
  return static_cast<int>(end < 0 ? 0 : (end > cols ? cols : end));
}

// S = Q K^T for a warp's M m-tiles of 16 rows and a tile of 8 N keys: af the rows' A
// fragments (head dim in steps of 16), ks the key tile. Each B fragment feeds M products.
template <typename T, int D, int M, int N, typename Ctx>
EMBER_TC_FN void scores(const Ctx& ctx, float (&s)[M][N][4], const uint32_t (&af)[M][D / 16][4],
                        const uint16_t* ks, int lane) {
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int n = 0; n < N; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      uint32_t bf[2][2];
      ldsm_b_t(ctx, bf, ks, kLd<D>, 8 * n, 16 * kk, lane);
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        ctx.template mma<T>(s[mt][n], af[mt][kk], bf[0]);
        ctx.template mma<T>(s[mt][n + 1], af[mt][kk], bf[1]);
      }
    }
  }
}

// acc += P X for a warp's M m-tiles: P the f32 C tiles of 8 N columns (rounded to T here), xs
// a tile of 8 N rows of width D.
template <typename T, int D, int M, int N, typename Ctx>
EMBER_TC_FN void accumulate(const Ctx& ctx, float (&acc)[M][D / 8][4], const float (&pc)[M][N][4],
                            const uint16_t* xs, int lane) {
#pragma unroll
  for (int kk = 0; kk < N / 2; ++kk) {
    uint32_t pa[M][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt) c_to_a<T>(pa[mt], pc[mt], kk);
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t bf[2][2];
      ldsm_b(ctx, bf, xs, kLd<D>, 16 * kk, 8 * n, lane);
#pragma unroll
      for (int mt = 0; mt < M; ++mt) {
        ctx.template mma<T>(acc[mt][n], pa[mt], bf[0]);
        ctx.template mma<T>(acc[mt][n + 1], pa[mt], bf[1]);
      }
    }
  }
}

// One key tile of the forward for a warp: S = Q K^T, the online softmax update of (m, l, o),
// O += P V. j0 is the tile's first key, w0 the warp's first row; ks, vs the tile's K and V
// in shared memory.
template <typename T, int D, bool kDropout, int kM, typename Ctx>
EMBER_TC_FN void forward_tile(const Ctx& ctx, const Params& p, int64_t b, int64_t j0, int64_t w0,
                              const int64_t (&row)[kM][2], const uint32_t (&qf)[kM][D / 16][4],
                              const uint16_t* ks, const uint16_t* vs, float (&o)[kM][D / 8][4],
                              float (&m)[kM][2], float (&l)[kM][2], Lane ln, int lane) {
  constexpr int kKeys = kForwardKeys<D>, kNd = D / 8, kNs = kKeys / 8;
  float s[kM][kNs][4];
  scores<T, D>(ctx, s, qf, ks, lane);
  // Scores in log2 units; on tiles that cross the diagonal or the end, the columns a row
  // does not see are -inf before the maximum.
  const bool edge = j0 + kKeys > p.lk || (p.causal && j0 + kKeys - 1 > w0);
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const int seen[2] = {seen_columns(p, row[mt][0], j0, kKeys),
                         seen_columns(p, row[mt][1], j0, kKeys)};
    float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
    for (int n = 0; n < kNs; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, col = 8 * n + 2 * ln.t + (e % 2);
        float x = s[mt][n][e] * p.scale_log2;
        if (edge && col >= seen[h]) x = -INFINITY;
        s[mt][n][e] = x;
        mx[h] = fmaxf(mx[h], x);
      }
    }
    float base[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = quad_max(ctx, mx[h]);
      base[h] = mx[h] == -INFINITY ? 0.0f : mx[h];  // a row with nothing yet stays at 0
      const float corr = fast_exp2(m[mt][h] - base[h]);
      m[mt][h] = mx[h];
      l[mt][h] *= corr;
#pragma unroll
      for (int n = 0; n < kNd; ++n) {
        o[mt][n][2 * h] *= corr;
        o[mt][n][2 * h + 1] *= corr;
      }
    }
    uint32_t keep = 0;
    if constexpr (kDropout) {
      keep = keep_bits<kNs>(p, ln, [&](int h, int c) {
        return static_cast<uint64_t>((b * p.lq + row[mt][h]) * p.lk + j0 + c);
      });
    }
#pragma unroll
    for (int n = 0; n < kNs; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2;
        const float w = fast_exp2(s[mt][n][e] - base[h]);
        l[mt][h] += w;  // this lane's part of the row sum
        s[mt][n][e] = kDropout ? w * keep_factor(p, keep, 4 * n + e) : w;
      }
    }
  }
  accumulate<T, D>(ctx, o, s, vs, lane);
}

// ---------------------------------------------------------------------------------------
// Forward: out and lse for kForwardRows<D> query rows of one batch-head.

template <typename T, int D, bool kDropout, typename Ctx>
EMBER_TC_FN void forward_block(const Ctx& ctx, const Params& p, int64_t block,
                               unsigned char* smem) {
  constexpr int kM = kForwardTiles<D>, kRows = kForwardRows<D>, kSpan = kWarpRows * kM;
  static_assert(kRows == 4 * kSpan, "4 warps of kSpan rows");
  constexpr int kLdD = kLd<D>, kKeys = kForwardKeys<D>, kKd = D / 16, kNd = D / 8;
  // Heaviest (causal: last) query blocks first.
  const int64_t nqb = ceil_div(p.lq, kRows);
  const int64_t qb = nqb - 1 - block / p.bh, b = block % p.bh;
  const int tid = ctx.thread(), warp = tid / 32, lane = tid % 32;
  const Lane ln{lane / 4, lane % 4};
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.lq * D;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + b * p.lk * D;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + b * p.lk * D;
  // The warp's rows: w0 .. w0 + kSpan - 1; this lane's, row[mt][h] = w0 + 16 mt + 8 h + g.
  const int64_t i0 = qb * kRows, w0 = i0 + kSpan * warp;
  int64_t row[kM][2];
  uint32_t qf[kM][kKd][4];
  float o[kM][kNd][4], m[kM][2], l[kM][2];  // m in log2 units
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    row[mt][0] = w0 + kWarpRows * mt + ln.g;
    row[mt][1] = row[mt][0] + 8;
#pragma unroll
    for (int kk = 0; kk < kKd; ++kk) {
      load_a_rows(qf[mt][kk], q, D, w0 + kWarpRows * mt, 16 * kk, p.lq, ln);
    }
#pragma unroll
    for (int n = 0; n < kNd; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  const bool live = w0 < p.lq;  // the warp has rows to compute

  // Key tiles through two shared-memory stages (K then V each): tile t + 1 is in flight
  // (cp.async) while tile t is computed.
  const int64_t key_end = p.causal && i0 + kRows < p.lk ? i0 + kRows : p.lk;
  const int64_t tiles = ceil_div(key_end, kKeys);
  const auto fetch = [&](int64_t t) {
    uint16_t* stage = reinterpret_cast<uint16_t*>(smem) + (t % 2) * 2 * kKeys * kLdD;
    load_tile_async<D>(ctx, stage, k, t * kKeys, kKeys, p.lk);
    load_tile_async<D>(ctx, stage + kKeys * kLdD, v, t * kKeys, kKeys, p.lk);
  };
  fetch(0);  // (key_end >= 1: every call has a key)
  ctx.commit();
  for (int64_t t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) fetch(t + 1);
    ctx.commit();               // (an empty group on the last tile keeps the count uniform)
    ctx.wait_newest_pending();  // this thread's copies of tile t have landed,
    ctx.sync();                 // and every thread's
    const int64_t j0 = t * kKeys;
    const uint16_t* ks = reinterpret_cast<const uint16_t*>(smem) + (t % 2) * 2 * kKeys * kLdD;
    const uint16_t* vs = ks + kKeys * kLdD;
    if (live && !(p.causal && j0 > w0 + kSpan - 1)) {  // warp-uniform
      forward_tile<T, D, kDropout>(ctx, p, b, j0, w0, row, qf, ks, vs, o, m, l, ln, lane);
    }
    ctx.sync();  // every warp is done with the stage before tile t + 2 lands there
  }

  if (!live) return;
  uint16_t* out = static_cast<uint16_t*>(p.out) + b * p.lq * D;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float total = quad_sum(ctx, l[mt][h]);
      const float inv = total > 0.0f ? 1.0f / total : 0.0f;
      const int64_t r = row[mt][h];
      if (r >= p.lq) continue;
#pragma unroll
      for (int n = 0; n < kNd; ++n) {
        store_u32(out + r * D + 8 * n + 2 * ln.t,
                  pack_floats<T>(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv));
      }
      if (ln.t == 0) p.lse[b * p.lq + r] = total > 0.0f ? m[mt][h] * kLn2 + logf(total) : -INFINITY;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Backward.

// dsum[r] = sum_c dO[r][c] * O[r][c] in f32; 8 threads per row, 16 rows per block.
template <typename T, int D, typename Ctx>
EMBER_TC_FN void row_dot_block(const Ctx& ctx, const Params& p, int64_t block) {
  const int tid = ctx.thread(), part = tid % 8;
  const int64_t r = block * kRowDotRows + tid / 8;
  const bool valid = r < p.bh * p.lq;
  const uint16_t* go = static_cast<const uint16_t*>(p.grad_out) + r * D;
  const uint16_t* o = static_cast<const uint16_t*>(p.out) + r * D;
  float total = 0.0f;
  if (valid) {
#pragma unroll
    for (int c = part * 8; c < D; c += 64) {
      alignas(16) uint16_t a[8];
      alignas(16) uint16_t bv[8];
      copy16(a, go + c);
      copy16(bv, o + c);
#pragma unroll
      for (int e = 0; e < 8; ++e) total += to_float<T>(a[e]) * to_float<T>(bv[e]);
    }
  }
  // The 8 threads of a row are lanes 8j .. 8j + 7 of one warp.
  total += ctx.shfl_xor(total, 1);
  total += ctx.shfl_xor(total, 2);
  total += ctx.shfl_xor(total, 4);
  if (valid && part == 0) p.dsum[r] = total;
}

// One key tile of dq for a warp: S = Q K^T, dP = dO V^T, dS = P * (dP * z - D), dQ += dS K.
template <typename T, int D, bool kDropout, int kM, typename Ctx>
EMBER_TC_FN void grad_q_tile(const Ctx& ctx, const Params& p, int64_t b, int64_t j0, int64_t w0,
                             const int64_t (&row)[kM][2], const uint32_t (&qf)[kM][D / 16][4],
                             const uint32_t (&gf)[kM][D / 16][4], const float (&lse2)[kM][2],
                             const float (&dsum)[kM][2], const uint16_t* ks, const uint16_t* vs,
                             float (&dq)[kM][D / 8][4], Lane ln, int lane) {
  constexpr int kKeys = kDqKeys<D>, kNs = kKeys / 8;
  float s[kM][kNs][4], dp[kM][kNs][4];
  scores<T, D>(ctx, s, qf, ks, lane);
  scores<T, D>(ctx, dp, gf, vs, lane);  // dP = dO V^T
  // dS = P * (dP * z - D), zero where a row does not see the key (s becomes dS).
  const bool edge = j0 + kKeys > p.lk || (p.causal && j0 + kKeys - 1 > w0);
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const int seen[2] = {seen_columns(p, row[mt][0], j0, kKeys),
                         seen_columns(p, row[mt][1], j0, kKeys)};
    uint32_t keep = 0;
    if constexpr (kDropout) {
      keep = keep_bits<kNs>(p, ln, [&](int h, int c) {
        return static_cast<uint64_t>((b * p.lq + row[mt][h]) * p.lk + j0 + c);
      });
    }
#pragma unroll
    for (int n = 0; n < kNs; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int h = e / 2, col = 8 * n + 2 * ln.t + (e % 2);
        const float w =
            edge && col >= seen[h] ? 0.0f : fast_exp2(s[mt][n][e] * p.scale_log2 - lse2[mt][h]);
        const float z = kDropout ? keep_factor(p, keep, 4 * n + e) : 1.0f;
        s[mt][n][e] = w * (dp[mt][n][e] * z - dsum[mt][h]);
      }
    }
  }
  accumulate<T, D>(ctx, dq, s, ks, lane);  // dQ += dS K
}

// dq for kDqRows<D> query rows of one batch-head.
template <typename T, int D, bool kDropout, typename Ctx>
EMBER_TC_FN void grad_q_block(const Ctx& ctx, const Params& p, int64_t block, unsigned char* smem) {
  constexpr int kM = kDqTiles<D>, kRows = kDqRows<D>, kSpan = kWarpRows * kM;
  static_assert(kRows == 4 * kSpan, "4 warps of kSpan rows");
  constexpr int kLdD = kLd<D>, kKeys = kDqKeys<D>, kKd = D / 16, kNd = D / 8;
  const int64_t nqb = ceil_div(p.lq, kRows);
  const int64_t qb = nqb - 1 - block / p.bh, b = block % p.bh;
  const int tid = ctx.thread(), warp = tid / 32, lane = tid % 32;
  const Lane ln{lane / 4, lane % 4};
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.lq * D;
  const uint16_t* go = static_cast<const uint16_t*>(p.grad_out) + b * p.lq * D;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + b * p.lk * D;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + b * p.lk * D;
  const int64_t i0 = qb * kRows, w0 = i0 + kSpan * warp;
  int64_t row[kM][2];
  uint32_t qf[kM][kKd][4], gf[kM][kKd][4];
  float lse2[kM][2], dsum[kM][2], dq[kM][kNd][4];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    row[mt][0] = w0 + kWarpRows * mt + ln.g;
    row[mt][1] = row[mt][0] + 8;
#pragma unroll
    for (int kk = 0; kk < kKd; ++kk) {
      load_a_rows(qf[mt][kk], q, D, w0 + kWarpRows * mt, 16 * kk, p.lq, ln);
      load_a_rows(gf[mt][kk], go, D, w0 + kWarpRows * mt, 16 * kk, p.lq, ln);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool in = row[mt][h] < p.lq;
      lse2[mt][h] = in ? p.lse[b * p.lq + row[mt][h]] * kLog2e : 0.0f;
      dsum[mt][h] = in ? p.dsum[b * p.lq + row[mt][h]] : 0.0f;
    }
#pragma unroll
    for (int n = 0; n < kNd; ++n) dq[mt][n][0] = dq[mt][n][1] = dq[mt][n][2] = dq[mt][n][3] = 0.0f;
  }
  const bool live = w0 < p.lq;

  // Key tiles through two shared-memory stages, as in the forward.
  const int64_t key_end = p.causal && i0 + kRows < p.lk ? i0 + kRows : p.lk;
  const int64_t tiles = ceil_div(key_end, kKeys);
  const auto fetch = [&](int64_t t) {
    uint16_t* stage = reinterpret_cast<uint16_t*>(smem) + (t % 2) * 2 * kKeys * kLdD;
    load_tile_async<D>(ctx, stage, k, t * kKeys, kKeys, p.lk);
    load_tile_async<D>(ctx, stage + kKeys * kLdD, v, t * kKeys, kKeys, p.lk);
  };
  fetch(0);
  ctx.commit();
  for (int64_t t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) fetch(t + 1);
    ctx.commit();
    ctx.wait_newest_pending();
    ctx.sync();
    const int64_t j0 = t * kKeys;
    const uint16_t* ks = reinterpret_cast<const uint16_t*>(smem) + (t % 2) * 2 * kKeys * kLdD;
    const uint16_t* vs = ks + kKeys * kLdD;
    if (live && !(p.causal && j0 > w0 + kSpan - 1)) {
      grad_q_tile<T, D, kDropout>(ctx, p, b, j0, w0, row, qf, gf, lse2, dsum, ks, vs, dq, ln, lane);
    }
    ctx.sync();
  }

  if (!live) return;
  uint16_t* gq = static_cast<uint16_t*>(p.grad_q) + b * p.lq * D;
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = row[mt][h];
      if (r >= p.lq) continue;
#pragma unroll
      for (int n = 0; n < kNd; ++n) {
        store_u32(gq + r * D + 8 * n + 2 * ln.t,
                  pack_floats<T>(dq[mt][n][2 * h] * p.scale, dq[mt][n][2 * h + 1] * p.scale));
      }
    }
  }
}

// One query tile of dk/dv for a warp's 16 keys: S^T = K Q^T, dP^T = V dO^T, dV += (P z)^T dO,
// dK += dS^T Q. i0 is the tile's first query, w0 the warp's first key (row kv_row of the
// block's K and V tiles ks, vs); qs, gs, lse, dsum the tile's Q, dO, logsumexp and D in shared
// memory.
template <typename T, int D, bool kDropout, typename Ctx>
EMBER_TC_FN void grad_kv_tile(const Ctx& ctx, const Params& p, int64_t b, int64_t i0, int64_t w0,
                              const int64_t (&key)[2], const uint16_t* ks, const uint16_t* vs,
                              const uint16_t* qs, const uint16_t* gs, const float* lse,
                              const float* dsum, int kv_row, float (&dk)[1][D / 8][4],
                              float (&dv)[1][D / 8][4], Lane ln, int lane) {
  constexpr int kLdD = kLd<D>, kQueries = kDkvQueries<D>, kKd = D / 16, kNs = kQueries / 8;
  // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys (rows) and the tile's queries; the
  // keys' and values' A fragments come from shared memory each tile (registers are short).
  float st[1][kNs][4], dpt[1][kNs][4];
  uint32_t af[1][kKd][4];
#pragma unroll
  for (int kk = 0; kk < kKd; ++kk) {
    ldsm_a(ctx, af[0][kk], ks, kLdD, kv_row, 16 * kk, lane);
  }
  scores<T, D>(ctx, st, af, qs, lane);
#pragma unroll
  for (int kk = 0; kk < kKd; ++kk) {
    ldsm_a(ctx, af[0][kk], vs, kLdD, kv_row, 16 * kk, lane);
  }
  scores<T, D>(ctx, dpt, af, gs, lane);
  // st becomes (P * z)^T, dpt dS^T; zero where the query does not see the key.
  const bool edge =
      i0 + kQueries > p.lq || w0 + kWarpRows > p.lk || (p.causal && i0 < w0 + kWarpRows - 1);
  int lo[2], hi[2];  // the query columns c with lo <= c < hi see the key
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t end = p.lq - i0 < kQueries ? p.lq - i0 : kQueries;
    const int64_t begin = p.causal ? key[h] - i0 : 0;
    hi[h] = key[h] < p.lk ? static_cast<int>(end) : 0;
    lo[h] = static_cast<int>(begin < 0 ? 0 : (begin > kQueries ? kQueries : begin));
  }
  uint32_t keep = 0;
  if constexpr (kDropout) {
    keep = keep_bits<kNs>(p, ln, [&](int h, int c) {
      return static_cast<uint64_t>((b * p.lq + i0 + c) * p.lk + key[h]);
    });
  }
#pragma unroll
  for (int n = 0; n < kNs; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int h = e / 2, c = 8 * n + 2 * ln.t + (e % 2);
      const bool seen = !edge || (c >= lo[h] && c < hi[h]);
      const float w = seen ? fast_exp2(st[0][n][e] * p.scale_log2 - lse[c] * kLog2e) : 0.0f;
      const float z = kDropout ? keep_factor(p, keep, 4 * n + e) : 1.0f;
      st[0][n][e] = w * z;
      dpt[0][n][e] = w * (dpt[0][n][e] * z - dsum[c]);
    }
  }
  accumulate<T, D>(ctx, dv, st, gs, lane);   // dV += (P z)^T dO
  accumulate<T, D>(ctx, dk, dpt, qs, lane);  // dK += dS^T Q
}

// dk and dv for 64 keys of one batch-head.
template <typename T, int D, bool kDropout, typename Ctx>
EMBER_TC_FN void grad_kv_block(const Ctx& ctx, const Params& p, int64_t block,
                               unsigned char* smem) {
  constexpr int kLdD = kLd<D>, kQueries = kDkvQueries<D>, kNd = D / 8;
  const int64_t kb = block / p.bh, b = block % p.bh;  // (causal: the first key blocks are heaviest)
  const int tid = ctx.thread(), warp = tid / 32, lane = tid % 32;
  const Lane ln{lane / 4, lane % 4};
  // Shared memory: K and V of the block's keys, then two stages of (Q tile, dO tile, lse, D).
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem);
  uint16_t* vs = ks + kBlockRows * kLdD;
  constexpr int kStage = 2 * kQueries * kLdD * 2 + 2 * kQueries * 4;  // bytes
  unsigned char* stages = smem + 2 * kBlockRows * kLdD * 2;
  const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.lq * D;
  const uint16_t* go = static_cast<const uint16_t*>(p.grad_out) + b * p.lq * D;
  const uint16_t* k = static_cast<const uint16_t*>(p.k) + b * p.lk * D;
  const uint16_t* v = static_cast<const uint16_t*>(p.v) + b * p.lk * D;
  const int64_t j0 = kb * kBlockRows, w0 = j0 + kWarpRows * warp;
  const int64_t key[2] = {w0 + ln.g, w0 + ln.g + 8};
  const bool live = w0 < p.lk;

  float dk[1][kNd][4], dv[1][kNd][4];  // (one m-tile of 16 keys per warp)
#pragma unroll
  for (int n = 0; n < kNd; ++n) {
    dk[0][n][0] = dk[0][n][1] = dk[0][n][2] = dk[0][n][3] = 0.0f;
    dv[0][n][0] = dv[0][n][1] = dv[0][n][2] = dv[0][n][3] = 0.0f;
  }

  // Query tiles from the first that can see these keys (causal: queries i < j0 see none),
  // through the two stages: tile t + 1 arrives by cp.async while tile t is computed.
  const int64_t first = p.causal ? j0 / kQueries * kQueries : 0;
  const int64_t tiles = first < p.lq ? ceil_div(p.lq - first, kQueries) : 0;
  const auto stage_of = [&](int64_t t) { return stages + (t % 2) * kStage; };
  const auto fetch = [&](int64_t t) {
    const int64_t i0 = first + t * kQueries;
    uint16_t* qs = reinterpret_cast<uint16_t*>(stage_of(t));
    uint16_t* gs = qs + kQueries * kLdD;
    float* lse = reinterpret_cast<float*>(gs + kQueries * kLdD);
    load_tile_async<D>(ctx, qs, q, i0, kQueries, p.lq);
    load_tile_async<D>(ctx, gs, go, i0, kQueries, p.lq);
    load_floats_async(ctx, lse, p.lse + b * p.lq, i0, kQueries, p.lq);
    load_floats_async(ctx, lse + kQueries, p.dsum + b * p.lq, i0, kQueries, p.lq);
  };
  if (tiles > 0) {  // (nothing in flight when the block has no work)
    load_tile_async<D>(ctx, ks, k, j0, kBlockRows, p.lk);
    load_tile_async<D>(ctx, vs, v, j0, kBlockRows, p.lk);
    fetch(0);
    ctx.commit();
  }
  for (int64_t t = 0; t < tiles; ++t) {
    if (t + 1 < tiles) fetch(t + 1);
    ctx.commit();
    ctx.wait_newest_pending();
    ctx.sync();
    const int64_t i0 = first + t * kQueries;
    const uint16_t* qs = reinterpret_cast<const uint16_t*>(stage_of(t));
    const uint16_t* gs = qs + kQueries * kLdD;
    const float* lse = reinterpret_cast<const float*>(gs + kQueries * kLdD);
    const float* dsum = lse + kQueries;
    if (live && !(p.causal && i0 + kQueries - 1 < w0)) {
      grad_kv_tile<T, D, kDropout>(ctx, p, b, i0, w0, key, ks, vs, qs, gs, lse, dsum,
                                   kWarpRows * warp, dk, dv, ln, lane);
    }
    ctx.sync();
  }

  if (!live) return;
  uint16_t* gk = static_cast<uint16_t*>(p.grad_k) + b * p.lk * D;
  uint16_t* gv = static_cast<uint16_t*>(p.grad_v) + b * p.lk * D;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (key[h] >= p.lk) continue;
#pragma unroll
    for (int n = 0; n < kNd; ++n) {
      const int64_t at = key[h] * D + 8 * n + 2 * ln.t;
      store_u32(gk + at, pack_floats<T>(dk[0][n][2 * h] * p.scale, dk[0][n][2 * h + 1] * p.scale));
      store_u32(gv + at, pack_floats<T>(dv[0][n][2 * h], dv[0][n][2 * h + 1]));
    }
  }
}

}  // namespace ember::detail::attention_tc

#if defined(EMBER_CUDA_EMULATED)
namespace ember::detail::emulated {  // the emulated copy of attention_tc.cu (device.cuh)
#else
namespace ember::detail {
#endif

// The host side (attention_tc.cu). Whether the tensor-core kernels can take a call: f16 or
// bf16, head dims E = Ev in {64, 128}, no empty dim, q, k, v and `others` 16-byte aligned,
// compute capability 8.0 or newer. The launches take the kernel table's arguments.
bool attention_tc_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                            std::initializer_list<const Tensor*> others);
void attention_tc_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                          const Tensor& v, const AttentionParams& params);
void attention_tc_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                           const Tensor& grad_out, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& out, const Tensor& lse,
                           const AttentionParams& params);

}  // namespace ember::detail

// CPU scaled-dot-product attention, tiled as FlashAttention-2 with OpenBLAS on the tiles.
//
// Forward: each (batch-head, block of kBlockQ queries) is one task; it walks the key blocks
// keeping one kBlockQ x bk block of scores, the running row maxima m, the sums l and the
// unnormalised output rows (online softmax), and stores out = acc / l and lse = m + log(l).
// Backward: each batch-head is one task (its dq, dk and dv rows are its own, so no two
// threads write one row); it walks key blocks, and in each the query blocks that can see
// them, recomputing P = exp(S - lse) per tile: dV += P^T dO, dP = dO V^T, dS = P * (dP - D)
// with D = rowsum(dO * O), dQ += scale dS K, dK += scale dS^T Q. Causal masks skip the
// blocks that lie wholly above the diagonal. Memory: per thread two score tiles and a row of
// D; never a Lq x Lk matrix. f16/bf16 compute in f32 copies of the operands.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "../detail/attention.h"
#include "../grad_mode.h"
#include "../ops.h"
#include "blas.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

constexpr int64_t kBlockQ = 64;

// NOTE: the tile products run inside OpenMP's threads, so each must stay single-threaded in
// OpenBLAS: its GEMM spawns threads above m * n * k = 65536 * 4. Wide heads get narrower key
// blocks to stay under it (E, Ev <= 64 keep 64 keys per block).
int64_t key_block(int64_t width) {
  return std::clamp<int64_t>(65536 * 4 / (kBlockQ * std::max<int64_t>(width, 1)), 16, 64);
}

// The shapes of one call, in elements.
struct Dims {
  int64_t bh, lq, lk, e, ev;
  explicit Dims(const Tensor& q, const Tensor& v)
      : bh(q.size(0)), lq(q.size(1)), lk(v.size(1)), e(q.size(2)), ev(v.size(2)) {}
};

// Dropout on the weights: the factor for weight `index` (0 or 1 / (1 - p)), 1 without dropout.
template <typename T>
struct DropoutRule {
  const AttentionParams& p;
  float keep = static_cast<float>(1.0 - p.dropout_p);
  T rescale = p.dropout_p < 1.0 ? static_cast<T>(1.0 / (1.0 - p.dropout_p)) : T(0);
  T factor(uint64_t index) const {
    return attention_keep(p.seed, p.offset, index, keep) ? rescale : T(0);
  }
};

// Per-thread scratch from the CPU allocator: `per_thread` elements for each of the threads a
// loop over `tasks` runs on (never more threads than tasks).
template <typename T>
struct Scratch {
  int threads;
  int64_t per_thread;
  Tensor buffer;
  Scratch(int64_t per, int64_t tasks, DType dtype)
      : threads(static_cast<int>(std::clamp<int64_t>(tasks, 1, omp_get_max_threads()))),
        per_thread(per),
        buffer(empty({threads * per}, dtype)) {}
  T* mine() const { return buffer.data_ptr<T>() + omp_get_thread_num() * per_thread; }
};

template <typename T>
void forward_typed(T* out, T* lse, const T* q, const T* k, const T* v, const Dims& d,
                   const AttentionParams& p, DType dtype) {
  const int64_t bq = kBlockQ, bk = key_block(std::max(d.e, d.ev));
  const int64_t nqb = (d.lq + bq - 1) / bq, tasks = d.bh * nqb;
  const T scale = static_cast<T>(p.scale), neg_inf = -std::numeric_limits<T>::infinity();
  const DropoutRule<T> dropout{p};
  const Scratch<T> scratch(bq * bk + bq * d.ev + 2 * bq, tasks, dtype);
#pragma omp parallel num_threads(scratch.threads) if (d.bh * d.lq * d.lk * d.e >= kParallelGrain)
  {
    T* const s = scratch.mine();
    T* const acc = s + bq * bk;
    T* const m = acc + bq * d.ev;
    T* const l = m + bq;
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / nqb, i0 = task % nqb * bq, rows = std::min(bq, d.lq - i0);
      const T* qi = q + (b * d.lq + i0) * d.e;
      std::fill(acc, acc + rows * d.ev, T(0));
      std::fill(m, m + rows, neg_inf);
      std::fill(l, l + rows, T(0));
      const int64_t key_end = p.causal ? std::min(d.lk, i0 + rows) : d.lk;
      for (int64_t j0 = 0; j0 < key_end; j0 += bk) {
        const int64_t cols = std::min(bk, key_end - j0);
        blas_gemm<T>(false, true, rows, cols, d.e, scale, qi, d.e, k + (b * d.lk + j0) * d.e, d.e,
                     T(0), s, bk);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = i0 + r;
          T* row = s + r * bk;
          const int64_t limit = p.causal ? std::clamp<int64_t>(i - j0 + 1, 0, cols) : cols;
          T mx = m[r];
          for (int64_t c = 0; c < limit; ++c) mx = std::max(mx, row[c]);
          if (mx == neg_inf) {  // every key so far masked (or -inf): nothing to add yet
            std::fill(row, row + cols, T(0));
            continue;
          }
          const T corr = std::exp(m[r] - mx);
          T total = 0;
          const uint64_t base = static_cast<uint64_t>((b * d.lq + i) * d.lk + j0);
          for (int64_t c = 0; c < limit; ++c) {
            const T e = std::exp(row[c] - mx);
            total += e;
            row[c] = p.dropout_p > 0.0 ? e * dropout.factor(base + c) : e;
          }
          std::fill(row + limit, row + cols, T(0));
          l[r] = l[r] * corr + total;
          m[r] = mx;
          if (corr != T(1)) {
            for (int64_t c = 0; c < d.ev; ++c) acc[r * d.ev + c] *= corr;
          }
        }
        blas_gemm<T>(false, false, rows, d.ev, cols, T(1), s, bk, v + (b * d.lk + j0) * d.ev, d.ev,
                     T(1), acc, d.ev);
      }
      for (int64_t r = 0; r < rows; ++r) {
        const T inv = l[r] > T(0) ? T(1) / l[r] : T(0);
        T* o = out + (b * d.lq + i0 + r) * d.ev;
        for (int64_t c = 0; c < d.ev; ++c) o[c] = acc[r * d.ev + c] * inv;
        lse[b * d.lq + i0 + r] = m[r] + std::log(l[r]);
      }
    }
  }
}

template <typename T>
void backward_typed(T* gq, T* gk, T* gv, const T* go, const T* q, const T* k, const T* v,
                    const T* o, const T* lse, const Dims& d, const AttentionParams& p,
                    DType dtype) {
  const int64_t bq = kBlockQ, bk = key_block(std::max(d.e, d.ev));
  const T scale = static_cast<T>(p.scale);
  const DropoutRule<T> dropout{p};
  const Scratch<T> scratch(2 * bq * bk + d.lq, d.bh, dtype);
#pragma omp parallel num_threads(scratch.threads) if (d.bh * d.lq * d.lk * d.e >= kParallelGrain)
  {
    T* const s = scratch.mine();
    T* const dp = s + bq * bk;
    T* const dsum = dp + bq * bk;
#pragma omp for schedule(dynamic)
    for (int64_t b = 0; b < d.bh; ++b) {
      const T* qb = q + b * d.lq * d.e;
      const T* kb = k + b * d.lk * d.e;
      const T* vb = v + b * d.lk * d.ev;
      const T* gob = go + b * d.lq * d.ev;
      const T* lb = lse + b * d.lq;
      T* gqb = gq + b * d.lq * d.e;
      T* gkb = gk + b * d.lk * d.e;
      T* gvb = gv + b * d.lk * d.ev;
      std::fill(gqb, gqb + d.lq * d.e, T(0));
      std::fill(gkb, gkb + d.lk * d.e, T(0));
      std::fill(gvb, gvb + d.lk * d.ev, T(0));
      for (int64_t i = 0; i < d.lq; ++i) {
        T total = 0;
        for (int64_t c = 0; c < d.ev; ++c)
          total += gob[i * d.ev + c] * o[(b * d.lq + i) * d.ev + c];
        dsum[i] = total;
      }
      for (int64_t j0 = 0; j0 < d.lk; j0 += bk) {
        const int64_t cols = std::min(bk, d.lk - j0);
        // Causal: the first query block holding a query i >= j0.
        for (int64_t i0 = p.causal ? j0 / bq * bq : 0; i0 < d.lq; i0 += bq) {
          const int64_t rows = std::min(bq, d.lq - i0);
          blas_gemm<T>(false, true, rows, cols, d.e, scale, qb + i0 * d.e, d.e, kb + j0 * d.e, d.e,
                       T(0), s, bk);
          blas_gemm<T>(false, true, rows, cols, d.ev, T(1), gob + i0 * d.ev, d.ev, vb + j0 * d.ev,
                       d.ev, T(0), dp, bk);
          for (int64_t r = 0; r < rows; ++r) {
            const int64_t i = i0 + r;
            const int64_t limit = p.causal ? std::clamp<int64_t>(i - j0 + 1, 0, cols) : cols;
            const uint64_t base = static_cast<uint64_t>((b * d.lq + i) * d.lk + j0);
            T* srow = s + r * bk;
            T* dprow = dp + r * bk;
            for (int64_t c = 0; c < limit; ++c) {
              const T weight = std::exp(srow[c] - lb[i]);
              const T z = p.dropout_p > 0.0 ? dropout.factor(base + c) : T(1);
              srow[c] = weight * z;                          // dropped weight, for dV
              dprow[c] = weight * (dprow[c] * z - dsum[i]);  // dS
            }
            std::fill(srow + limit, srow + cols, T(0));
            std::fill(dprow + limit, dprow + cols, T(0));
          }
          blas_gemm<T>(true, false, cols, d.ev, rows, T(1), s, bk, gob + i0 * d.ev, d.ev, T(1),
                       gvb + j0 * d.ev, d.ev);
          blas_gemm<T>(false, false, rows, d.e, cols, scale, dp, bk, kb + j0 * d.e, d.e, T(1),
                       gqb + i0 * d.e, d.e);
          blas_gemm<T>(true, false, cols, d.e, rows, scale, dp, bk, qb + i0 * d.e, d.e, T(1),
                       gkb + j0 * d.e, d.e);
        }
      }
    }
  }
}

// f32 copies of 16-bit operands (the tensor itself otherwise).
Tensor compute_copy(const Tensor& t) {
  return t.dtype() == kF64 || t.dtype() == kF32 ? t : t.to(kF32);
}

void attention_forward_cpu(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                           const Tensor& v, const AttentionParams& params) {
  EMBER_ASSERT(out.is_contiguous() && lse.is_contiguous() && q.is_contiguous() &&
               k.is_contiguous() && v.is_contiguous());
  NoGradGuard no_grad;
  const Dims d(q, v);
  if (q.dtype() == kF64) {
    forward_typed<double>(out.data_ptr<double>(), lse.data_ptr<double>(), q.data_ptr<double>(),
                          k.data_ptr<double>(), v.data_ptr<double>(), d, params, kF64);
    return;
  }
  const Tensor o = out.dtype() == kF32 ? out : empty(out.sizes(), kF32);
  const Tensor qc = compute_copy(q), kc = compute_copy(k), vc = compute_copy(v);
  forward_typed<float>(o.data_ptr<float>(), lse.data_ptr<float>(), qc.data_ptr<float>(),
                       kc.data_ptr<float>(), vc.data_ptr<float>(), d, params, kF32);
  if (!o.is_same(out)) Tensor(out).copy_(o);
}

void attention_backward_cpu(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                            const Tensor& grad_out, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& out, const Tensor& lse,
                            const AttentionParams& params) {
  EMBER_ASSERT(grad_out.is_contiguous() && out.is_contiguous() && lse.is_contiguous() &&
               q.is_contiguous() && k.is_contiguous() && v.is_contiguous());
  NoGradGuard no_grad;
  const Dims d(q, v);
  if (q.dtype() == kF64) {
    backward_typed<double>(grad_q.data_ptr<double>(), grad_k.data_ptr<double>(),
                           grad_v.data_ptr<double>(), grad_out.data_ptr<double>(),
                           q.data_ptr<double>(), k.data_ptr<double>(), v.data_ptr<double>(),
                           out.data_ptr<double>(), lse.data_ptr<double>(), d, params, kF64);
    return;
  }
  const bool f32 = q.dtype() == kF32;
  const Tensor gq = f32 ? grad_q : empty(grad_q.sizes(), kF32);
  const Tensor gk = f32 ? grad_k : empty(grad_k.sizes(), kF32);
  const Tensor gv = f32 ? grad_v : empty(grad_v.sizes(), kF32);
  const Tensor goc = compute_copy(grad_out), qc = compute_copy(q), kc = compute_copy(k),
               vc = compute_copy(v), oc = compute_copy(out);
  backward_typed<float>(gq.data_ptr<float>(), gk.data_ptr<float>(), gv.data_ptr<float>(),
                        goc.data_ptr<float>(), qc.data_ptr<float>(), kc.data_ptr<float>(),
                        vc.data_ptr<float>(), oc.data_ptr<float>(), lse.data_ptr<float>(), d,
                        params, kF32);
  if (!f32) {
    Tensor(grad_q).copy_(gq);
    Tensor(grad_k).copy_(gk);
    Tensor(grad_v).copy_(gv);
  }
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(attention) {
  table.attention_forward = &attention_forward_cpu;
  table.attention_backward = &attention_backward_cpu;
}

}  // namespace ember::detail

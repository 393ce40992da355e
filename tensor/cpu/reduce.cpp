// CPU reductions, arg-reductions and softmax. Floats accumulate in double, integers in i64.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "../detail/dispatch.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

template <typename T>
inline wide_acc_t<T> load(T x) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(x));
  } else {
    return static_cast<wide_acc_t<T>>(x);
  }
}

template <typename T, typename A>
inline T store(A value) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, bool>) {
    return value != 0;
  } else {
    return static_cast<T>(value);
  }
}

// NOTE: long rows are split into fixed chunks of kParallelGrain elements whose partials
// are combined in order, so a result does not depend on the number of threads.
template <typename Acc, typename Partial, typename Combine>
Acc chunked(int64_t r, bool parallel, Acc init, Partial partial, Combine combine) {
  if (r <= kParallelGrain) return partial(int64_t{0}, r);
  const int64_t chunks = (r + kParallelGrain - 1) / kParallelGrain;
  std::vector<Acc> partials(static_cast<size_t>(chunks), init);
#pragma omp parallel for if (parallel) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    partials[c] = partial(c * kParallelGrain, std::min(r, (c + 1) * kParallelGrain));
  }
  Acc result = partials[0];
  for (int64_t c = 1; c < chunks; ++c) result = combine(result, partials[c]);
  return result;
}

// Sum of f(x) over a row, accumulated in A.
template <typename A, typename T, typename F>
A sum_row(const T* x, int64_t r, bool parallel, F f) {
  return chunked<A>(
      r, parallel, A(0),
      [&](int64_t begin, int64_t end) {
        A acc = 0;
#pragma omp simd reduction(+ : acc)
        for (int64_t i = begin; i < end; ++i) acc += f(load(x[i]));
        return acc;
      },
      [](A a, A b) { return a + b; });
}

// The max (or min) of f(x) over a non-empty row; for floats NaN wins, as in PyTorch.
template <bool kMax, typename T, typename F>
wide_acc_t<T> extreme_row(const T* x, int64_t r, bool parallel, F f) {
  using A = wide_acc_t<T>;
  struct Partial {
    A value;
    bool nan;
  };
  const Partial result = chunked<Partial>(
      r, parallel, Partial{f(load(x[0])), false},
      [&](int64_t begin, int64_t end) {
        A m = f(load(x[begin]));
        int nan = 0;
        if constexpr (kMax) {
#pragma omp simd reduction(max : m) reduction(| : nan)
          for (int64_t i = begin; i < end; ++i) {
            const A v = f(load(x[i]));
            m = v > m ? v : m;
            if constexpr (kIsFloat<T>) nan |= (v != v);
          }
        } else {
#pragma omp simd reduction(min : m) reduction(| : nan)
          for (int64_t i = begin; i < end; ++i) {
            const A v = f(load(x[i]));
            m = v < m ? v : m;
            if constexpr (kIsFloat<T>) nan |= (v != v);
          }
        }
        return Partial{m, nan != 0};
      },
      [](Partial a, Partial b) {
        if constexpr (kMax)
          return Partial{std::max(a.value, b.value), a.nan || b.nan};
        else
          return Partial{std::min(a.value, b.value), a.nan || b.nan};
      });
  if constexpr (kIsFloat<T>) {
    if (result.nan) return std::numeric_limits<double>::quiet_NaN();
  }
  return result.value;
}

template <typename T>
T reduce_one_row(ReduceOp op, const T* x, int64_t r, double p, int64_t correction, bool parallel) {
  using A = wide_acc_t<T>;
  const auto identity = [](A v) { return v; };
  switch (op) {
    case ReduceOp::kSum:
      return store<T>(sum_row<A>(x, r, parallel, identity));
    case ReduceOp::kMean:
      return store<T>(static_cast<double>(sum_row<A>(x, r, parallel, identity)) /
                      static_cast<double>(r));
    case ReduceOp::kMax:
      return store<T>(extreme_row<true>(x, r, parallel, identity));
    case ReduceOp::kMin:
      return store<T>(extreme_row<false>(x, r, parallel, identity));
    case ReduceOp::kVar: {
      const auto as_double = [](A v) { return static_cast<double>(v); };
      const double mean = sum_row<double>(x, r, parallel, as_double) / static_cast<double>(r);
      const double ss = sum_row<double>(x, r, parallel, [mean](A v) {
        const double d = static_cast<double>(v) - mean;
        return d * d;
      });
      const double dof = std::max<double>(0.0, static_cast<double>(r - correction));
      return store<T>(ss / dof);
    }
    case ReduceOp::kNorm: {
      const auto magnitude = [](A v) { return static_cast<double>(v < 0 ? -v : v); };
      if (std::isinf(p)) {
        if (r == 0) return store<T>(0.0);
        return store<T>(extreme_row<true>(x, r, parallel, [](A v) { return v < 0 ? -v : v; }));
      }
      if (p == 1.0) return store<T>(sum_row<double>(x, r, parallel, magnitude));
      if (p == 2.0) {
        return store<T>(std::sqrt(sum_row<double>(x, r, parallel, [](A v) {
          const double d = static_cast<double>(v);
          return d * d;
        })));
      }
      const double s = sum_row<double>(
          x, r, parallel, [p](A v) { return std::pow(std::abs(static_cast<double>(v)), p); });
      return store<T>(std::pow(s, 1.0 / p));
    }
  }
  EMBER_ASSERT(false, "unknown ReduceOp ", static_cast<int>(op));
  return T{};
}

// Rows go to threads when there are enough of them; otherwise each long row is split.
bool rows_in_parallel(int64_t outer, int64_t r) {
  return outer >= omp_get_max_threads() && outer * std::max<int64_t>(r, 1) >= kParallelGrain;
}

void reduce_cpu(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t r,
                double p, int64_t correction) {
  EMBER_ASSERT(out.dtype() == in.dtype() && out.is_contiguous() && in.is_contiguous());
  EMBER_ASSERT(out.numel() == outer && in.numel() == outer * r);
  dispatch_all(in.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    const bool by_rows = rows_in_parallel(outer, r);
#pragma omp parallel for if (by_rows) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      y[o] = reduce_one_row(op, x + o * r, r, p, correction, !by_rows);
    }
  });
}

// Index of the max (or min) of a non-empty row: the first NaN, else the first extreme.
template <bool kMax, typename T>
std::pair<wide_acc_t<T>, int64_t> arg_row(const T* x, int64_t r, bool parallel) {
  using A = wide_acc_t<T>;
  using Best = std::pair<A, int64_t>;
  // a is better than b when it is NaN (and b is not) or strictly more extreme.
  const auto better = [](A a, A b) {
    if constexpr (kIsFloat<T>) {
      if (a != a) return b == b;
      if (b != b) return false;
    }
    if constexpr (kMax)
      return a > b;
    else
      return a < b;
  };
  return chunked<Best>(
      r, parallel, Best{load(x[0]), 0},
      [&](int64_t begin, int64_t end) {
        Best best{load(x[begin]), begin};
        for (int64_t i = begin + 1; i < end; ++i) {
          const A v = load(x[i]);
          if (better(v, best.first)) best = {v, i};
        }
        return best;
      },
      [&](Best a, Best b) { return better(b.first, a.first) ? b : a; });
}

void arg_reduce_cpu(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in,
                    int64_t outer, int64_t r) {
  EMBER_ASSERT(r > 0 && values.dtype() == in.dtype() && indices.dtype() == kI64);
  EMBER_ASSERT(values.numel() == outer && indices.numel() == outer && in.numel() == outer * r);
  dispatch_all(in.dtype(), "arg_reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* v = static_cast<T*>(values.data_ptr());
    int64_t* idx = static_cast<int64_t*>(indices.data_ptr());
    const bool by_rows = rows_in_parallel(outer, r);
#pragma omp parallel for if (by_rows) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const auto best =
          is_max ? arg_row<true>(x + o * r, r, !by_rows) : arg_row<false>(x + o * r, r, !by_rows);
      v[o] = store<T>(best.first);
      idx[o] = best.second;
    }
  });
}

// Softmax over n values at stride `inner`, for `width` neighbouring columns at once (so
// the loops over columns run on contiguous memory); computed in double.
inline constexpr int64_t kSoftmaxBlock = 64;

template <typename T>
void softmax_block(T* y, const T* x, int64_t n, int64_t inner, int64_t width, bool log) {
  double m[kSoftmaxBlock], s[kSoftmaxBlock];
  for (int64_t i = 0; i < width; ++i) {
    m[i] = -std::numeric_limits<double>::infinity();
    s[i] = 0;
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* row = x + j * inner;
    for (int64_t i = 0; i < width; ++i) m[i] = std::max(m[i], load(row[i]));
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* row = x + j * inner;
    for (int64_t i = 0; i < width; ++i) s[i] += std::exp(load(row[i]) - m[i]);
  }
  for (int64_t i = 0; i < width; ++i) {
    if (log) {
      m[i] += std::log(s[i]);
    } else {
      s[i] = 1.0 / s[i];
    }
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* row = x + j * inner;
    T* out = y + j * inner;
    if (log) {
      for (int64_t i = 0; i < width; ++i) out[i] = store<T>(load(row[i]) - m[i]);
    } else {
      for (int64_t i = 0; i < width; ++i) out[i] = store<T>(std::exp(load(row[i]) - m[i]) * s[i]);
    }
  }
}

// One contiguous row (inner == 1), the common case of softmax over the last dim.
template <typename T>
void softmax_row(T* y, const T* x, int64_t n, bool log) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, load(x[j]));
  double s = 0;
  for (int64_t j = 0; j < n; ++j) s += std::exp(load(x[j]) - m);
  if (log) {
    const double shift = m + std::log(s);
    for (int64_t j = 0; j < n; ++j) y[j] = store<T>(load(x[j]) - shift);
  } else {
    const double scale = 1.0 / s;
    for (int64_t j = 0; j < n; ++j) y[j] = store<T>(std::exp(load(x[j]) - m) * scale);
  }
}

void softmax_cpu(const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner,
                 bool log) {
  EMBER_ASSERT(out.dtype() == in.dtype() && out.is_contiguous() && in.is_contiguous());
  EMBER_ASSERT(in.numel() == outer * n * inner && out.numel() == in.numel());
  if (in.numel() == 0) return;
  dispatch_floating(in.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = static_cast<const T*>(in.data_ptr());
    T* y = static_cast<T*>(out.data_ptr());
    const int64_t blocks = (inner + kSoftmaxBlock - 1) / kSoftmaxBlock;
    const int64_t tasks = outer * blocks;
#pragma omp parallel for if (tasks > 1 && outer * n * inner >= kParallelGrain) schedule(static)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t o = t / blocks;
      const int64_t i0 = (t % blocks) * kSoftmaxBlock;
      const int64_t base = o * n * inner + i0;
      if (inner == 1) {
        softmax_row(y + base, x + base, n, log);
      } else {
        softmax_block(y + base, x + base, n, inner, std::min(kSoftmaxBlock, inner - i0), log);
      }
    }
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(reduce) {
  table.reduce = &reduce_cpu;
  table.arg_reduce = &arg_reduce_cpu;
  table.softmax = &softmax_cpu;
}

}  // namespace ember::detail

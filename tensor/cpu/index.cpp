// CPU index_select, gather and scatter_add. Indices arrive as i64, already range-checked.
#include <cstring>
#include <type_traits>
#include <vector>

#include "../detail/dispatch.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

void index_select_cpu(const Tensor& out, const Tensor& in, const Tensor& index, int64_t outer,
                      int64_t n, int64_t inner) {
  EMBER_ASSERT(out.dtype() == in.dtype() && index.dtype() == kI64);
  EMBER_ASSERT(out.is_contiguous() && in.is_contiguous() && index.is_contiguous());
  const int64_t k = index.numel();
  EMBER_ASSERT(out.numel() == outer * k * inner && in.numel() == outer * n * inner);
  if (out.numel() == 0) return;
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  dispatch_word(in.dtype(), [&](auto tag) {
    using W = typename decltype(tag)::type;
    const W* x = static_cast<const W*>(in.data_ptr());
    W* y = static_cast<W*>(out.data_ptr());
    const int64_t rows = outer * k;
#pragma omp parallel for if (rows > 1 && rows * inner >= kParallelGrain) schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t o = row / k;
      const W* src = x + (o * n + idx[row % k]) * inner;
      W* dst = y + row * inner;
      if (inner == 1) {
        *dst = *src;
      } else {
        std::memcpy(dst, src, static_cast<size_t>(inner) * sizeof(W));
      }
    }
  });
}

// Offsets into a contiguous tensor of `sizes` of every position of `index_sizes` dims
// [begin, end), in row-major order: the index may be smaller than the tensor in each dim.
std::vector<int64_t> positions(const Shape& index_sizes, const Shape& sizes, size_t begin,
                               size_t end) {
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  std::vector<int64_t> result{0};
  for (size_t d = begin; d < end; ++d) {
    std::vector<int64_t> next;
    next.reserve(result.size() * static_cast<size_t>(index_sizes[d]));
    for (const int64_t base : result) {
      for (int64_t i = 0; i < index_sizes[d]; ++i) next.push_back(base + i * strides[d]);
    }
    result = std::move(next);
  }
  return result;
}

// The geometry gather and scatter_add share: index viewed as [outer, k, inner]; the data
// tensor's offset of (o, j, i) is outer_pos[o] + index * dim_stride + inner_pos[i].
struct IndexGeometry {
  std::vector<int64_t> outer_pos, inner_pos;
  int64_t k = 0, dim_stride = 0;
};

IndexGeometry index_geometry(const Shape& index_sizes, const Shape& data_sizes, int64_t dim) {
  const auto d = static_cast<size_t>(dim);
  IndexGeometry g;
  g.outer_pos = positions(index_sizes, data_sizes, 0, d);
  g.inner_pos = positions(index_sizes, data_sizes, d + 1, index_sizes.size());
  g.k = index_sizes[d];
  g.dim_stride = 1;
  for (size_t e = d + 1; e < data_sizes.size(); ++e) g.dim_stride *= data_sizes[e];
  return g;
}

void gather_cpu(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  EMBER_ASSERT(out.dtype() == in.dtype() && index.dtype() == kI64 && out.sizes() == index.sizes());
  EMBER_ASSERT(out.is_contiguous() && in.is_contiguous() && index.is_contiguous());
  if (out.numel() == 0) return;
  const IndexGeometry g = index_geometry(index.sizes(), in.sizes(), dim);
  const auto outer = static_cast<int64_t>(g.outer_pos.size());
  const auto inner = static_cast<int64_t>(g.inner_pos.size());
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  dispatch_word(in.dtype(), [&](auto tag) {
    using W = typename decltype(tag)::type;
    const W* x = static_cast<const W*>(in.data_ptr());
    W* y = static_cast<W*>(out.data_ptr());
#pragma omp parallel for if (outer > 1 && out.numel() >= kParallelGrain) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const int64_t base = g.outer_pos[o];
      for (int64_t j = 0; j < g.k; ++j) {
        const int64_t flat = (o * g.k + j) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          y[flat + i] = x[base + idx[flat + i] * g.dim_stride + g.inner_pos[i]];
        }
      }
    }
  });
}

template <typename T>
inline T add_values(T a, T b) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(a) + static_cast<float>(b));
  } else if constexpr (std::is_same_v<T, bool>) {
    return a || b;
  } else {
    return static_cast<T>(a + b);
  }
}

void scatter_add_cpu(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  EMBER_ASSERT(self.dtype() == src.dtype() && index.dtype() == kI64 &&
               src.sizes() == index.sizes());
  EMBER_ASSERT(self.is_contiguous() && index.is_contiguous() && src.is_contiguous());
  if (index.numel() == 0) return;
  const IndexGeometry g = index_geometry(index.sizes(), self.sizes(), dim);
  const auto outer = static_cast<int64_t>(g.outer_pos.size());
  const auto inner = static_cast<int64_t>(g.inner_pos.size());
  const int64_t* idx = static_cast<const int64_t*>(index.data_ptr());
  dispatch_all(self.dtype(), "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* y = static_cast<T*>(self.data_ptr());
    const T* s = static_cast<const T*>(src.data_ptr());
    // Different outer positions write disjoint parts of self, so they may run in parallel.
#pragma omp parallel for if (outer > 1 && index.numel() >= kParallelGrain) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      const int64_t base = g.outer_pos[o];
      for (int64_t j = 0; j < g.k; ++j) {
        const int64_t flat = (o * g.k + j) * inner;
        for (int64_t i = 0; i < inner; ++i) {
          T& target = y[base + idx[flat + i] * g.dim_stride + g.inner_pos[i]];
          target = add_values(target, s[flat + i]);
        }
      }
    }
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(index) {
  table.index_select = &index_select_cpu;
  table.gather = &gather_cpu;
  table.scatter_add = &scatter_add_cpu;
}

}  // namespace ember::detail

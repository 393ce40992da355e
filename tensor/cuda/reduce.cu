// Row reductions over contiguous [outer, r] (sum, mean, max, min, var, norm), arg max/min,
// and softmax / log_softmax over [outer, n, inner].
//
// A row is reduced by a group of threads: one warp per row when rows are short, one block
// per row otherwise. Each thread folds a strided slice of the row, then the group combines
// the partial results in a fixed order, so results do not depend on timing.
#include <cmath>

#include "../detail/dispatch.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

constexpr int kWarp = 32;
constexpr int kBlockGroup = 512;         // threads per row for long rows
constexpr int kRowsPerWarpBlock = 8;     // rows per block when a warp takes a row
constexpr int64_t kWarpRowLimit = 1024;  // rows up to this long go one warp each

// Sums accumulate in acc_t (float for f32/f16/bf16, double for f64, int64 for integers);
// mean/var/norm math runs in real_t: double for f64 and integers, float otherwise.
template <typename T>
using real_t = std::conditional_t<std::is_same_v<acc_t<T>, float>, float, double>;

template <typename A>
__device__ __forceinline__ A shuffle_xor(A value, int mask) {
  if constexpr (std::is_same_v<A, int64_t>) {
    return static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(value), mask));
  } else {
    return __shfl_xor_sync(0xffffffffu, value, mask);
  }
}

template <typename A>
__device__ __forceinline__ bool is_nan(A x) {
  if constexpr (std::is_floating_point_v<A>) {
    return x != x;
  } else {
    return false;
  }
}

template <typename A>
__device__ __forceinline__ A lowest_value() {
  if constexpr (std::is_floating_point_v<A>) {
    return -INFINITY;
  } else {
    return INT64_MIN;
  }
}
template <typename A>
__device__ __forceinline__ A highest_value() {
  if constexpr (std::is_floating_point_v<A>) {
    return INFINITY;
  } else {
    return INT64_MAX;
  }
}

// max/min that let a NaN win, as PyTorch's reductions do.
template <typename A>
__device__ __forceinline__ A nan_max(A a, A b) {
  return is_nan(a) ? a : (is_nan(b) ? b : (a > b ? a : b));
}
template <typename A>
__device__ __forceinline__ A nan_min(A a, A b) {
  return is_nan(a) ? a : (is_nan(b) ? b : (a < b ? a : b));
}

struct SumOp {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return a + b;
  }
};
struct MaxOp {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return nan_max(a, b);
  }
};
struct MinOp {
  template <typename A>
  __device__ A operator()(A a, A b) const {
    return nan_min(a, b);
  }
};

// Combines one value per thread across a group of Group threads; every thread gets the
// result. `shared` holds Group / 32 values; the group is a warp or the whole block.
template <int Group, typename A, typename Combine>
__device__ __forceinline__ A group_reduce(A value, Combine combine, A* shared) {
#pragma unroll
  for (int mask = kWarp / 2; mask > 0; mask >>= 1) value = combine(value, shuffle_xor(value, mask));
  if constexpr (Group == kWarp) {
    return value;
  } else {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    __syncthreads();  // the previous use of `shared` is finished
    if (lane == 0) shared[warp] = value;
    __syncthreads();
    value = shared[0];
#pragma unroll
    for (int w = 1; w < Group / kWarp; ++w) value = combine(value, shared[w]);
    return value;
  }
}

// Which row this group takes first, how far to step, and this thread's place in the group.
template <int Group>
struct RowGroup {
  int64_t first_row, row_step;
  int lane;
  __device__ RowGroup() {
    if constexpr (Group == kWarp) {
      first_row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
      row_step = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
      lane = threadIdx.x % kWarp;
    } else {
      first_row = blockIdx.x;
      row_step = gridDim.x;
      lane = threadIdx.x;
    }
  }
};

template <int Group>
unsigned row_grid(int64_t rows) {
  const int64_t blocks = Group == kWarp ? (rows + kRowsPerWarpBlock - 1) / kRowsPerWarpBlock : rows;
  return static_cast<unsigned>(std::min<int64_t>(blocks, kMaxGridBlocks));
}
template <int Group>
constexpr int row_block() {
  return Group == kWarp ? kWarp * kRowsPerWarpBlock : Group;
}

// --- reduce ----------------------------------------------------------------------------------

template <int Group, typename T>
__global__ void reduce_rows_kernel(ReduceOp op, T* out, const T* in, int64_t outer, int64_t r,
                                   double p, int64_t correction) {
  using A = acc_t<T>;
  using R = real_t<T>;
  EMBER_SHARED(A, shared_a, [Group == kWarp ? 1 : Group / kWarp]);
  EMBER_SHARED(R, shared_r, [Group == kWarp ? 1 : Group / kWarp]);
  const RowGroup<Group> g;
  for (int64_t row = g.first_row; row < outer; row += g.row_step) {
    const T* x = in + row * r;
    R result = 0;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: {
        A sum = 0;
        for (int64_t j = g.lane; j < r; j += Group) sum += cast_to<A>(x[j]);
        sum = group_reduce<Group>(sum, SumOp{}, shared_a);
        if (op == ReduceOp::kSum) {
          if (g.lane == 0) out[row] = cast_to<T>(sum);
          continue;
        }
        result = static_cast<R>(sum) / static_cast<R>(r);
        break;
      }
      case ReduceOp::kMax:
      case ReduceOp::kMin: {
        const bool is_max = op == ReduceOp::kMax;
        A best = is_max ? lowest_value<A>() : highest_value<A>();
        for (int64_t j = g.lane; j < r; j += Group) {
          const A v = cast_to<A>(x[j]);
          best = is_max ? nan_max(best, v) : nan_min(best, v);
        }
        best = is_max ? group_reduce<Group>(best, MaxOp{}, shared_a)
                      : group_reduce<Group>(best, MinOp{}, shared_a);
        if (g.lane == 0) out[row] = cast_to<T>(best);
        continue;
      }
      case ReduceOp::kVar: {  // two passes: the mean, then squared deviations from it
        R sum = 0;
        for (int64_t j = g.lane; j < r; j += Group) sum += cast_to<R>(x[j]);
        const R mean = group_reduce<Group>(sum, SumOp{}, shared_r) / static_cast<R>(r);
        R squares = 0;
        for (int64_t j = g.lane; j < r; j += Group) {
          const R d = cast_to<R>(x[j]) - mean;
          squares += d * d;
        }
        squares = group_reduce<Group>(squares, SumOp{}, shared_r);
        const int64_t dof = r - correction > 0 ? r - correction : 0;
        result = squares / static_cast<R>(dof);
        break;
      }
      case ReduceOp::kNorm: {
        if (isinf(p)) {
          R best = p > 0 ? R(0) : R(INFINITY);
          for (int64_t j = g.lane; j < r; j += Group) {
            const R v = fabs(cast_to<R>(x[j]));
            best = p > 0 ? nan_max(best, v) : nan_min(best, v);
          }
          result = p > 0 ? group_reduce<Group>(best, MaxOp{}, shared_r)
                         : group_reduce<Group>(best, MinOp{}, shared_r);
          break;
        }
        R sum = 0;
        for (int64_t j = g.lane; j < r; j += Group) {
          const R v = fabs(cast_to<R>(x[j]));
          if (p == 0) {
            sum += v != R(0) ? R(1) : R(0);
          } else if (p == 1) {
            sum += v;
          } else if (p == 2) {
            sum += v * v;
          } else {
            sum += pow(v, static_cast<R>(p));
          }
        }
        sum = group_reduce<Group>(sum, SumOp{}, shared_r);
        if (p == 0 || p == 1) {
          result = sum;
        } else if (p == 2) {
          result = sqrt(sum);
        } else {
          result = pow(sum, static_cast<R>(1.0 / p));
        }
        break;
      }
    }
    if (g.lane == 0) out[row] = cast_to<T>(result);
  }
}

template <int Group, typename T>
void launch_reduce(ReduceOp op, T* out, const T* in, int64_t outer, int64_t r, double p,
                   int64_t correction, cudaStream_t stream) {
  EMBER_LAUNCH(row_grid<Group>(outer), row_block<Group>(), 0, stream, reduce_rows_kernel<Group, T>)
  (op, out, in, outer, r, p, correction);
  EMBER_CUDA_CHECK_LAUNCH();
}

void reduce_cuda(ReduceOp op, const Tensor& out, const Tensor& in, int64_t outer, int64_t r,
                 double p, int64_t correction) {
  if (outer == 0) return;
  KernelContext ctx(out);
  dispatch_all(in.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out_data = static_cast<T*>(out.data_ptr());
    const T* in_data = static_cast<const T*>(in.data_ptr());
    if (r <= kWarpRowLimit) {
      launch_reduce<kWarp>(op, out_data, in_data, outer, r, p, correction, ctx.stream);
    } else {
      launch_reduce<kBlockGroup>(op, out_data, in_data, outer, r, p, correction, ctx.stream);
    }
  });
}

// --- arg_reduce ----------------------------------------------------------------------------

// Whether (a, ia) beats (b, ib): NaN beats every number, then the larger (smaller) value,
// then the lower index. ib < 0 marks "nothing yet".
template <typename A>
__device__ __forceinline__ bool arg_better(bool is_max, A a, int64_t ia, A b, int64_t ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  const bool a_nan = is_nan(a), b_nan = is_nan(b);
  if (a_nan || b_nan) return a_nan && (!b_nan || ia < ib);
  if (a != b) return is_max ? a > b : a < b;
  return ia < ib;
}

template <int Group, typename T>
__global__ void arg_reduce_kernel(bool is_max, T* values, int64_t* indices, const T* in,
                                  int64_t outer, int64_t r) {
  using A = acc_t<T>;
  EMBER_SHARED(A, shared_value, [Group == kWarp ? 1 : Group / kWarp]);
  EMBER_SHARED(int64_t, shared_index, [Group == kWarp ? 1 : Group / kWarp]);
  const RowGroup<Group> g;
  for (int64_t row = g.first_row; row < outer; row += g.row_step) {
    const T* x = in + row * r;
    A best = A(0);
    int64_t best_index = -1;
    for (int64_t j = g.lane; j < r; j += Group) {
      const A v = cast_to<A>(x[j]);
      if (arg_better(is_max, v, j, best, best_index)) {
        best = v;
        best_index = j;
      }
    }
#pragma unroll
    for (int mask = kWarp / 2; mask > 0; mask >>= 1) {
      const A other = shuffle_xor(best, mask);
      const int64_t other_index = shuffle_xor(best_index, mask);
      if (arg_better(is_max, other, other_index, best, best_index)) {
        best = other;
        best_index = other_index;
      }
    }
    if constexpr (Group != kWarp) {
      const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
      __syncthreads();
      if (lane == 0) {
        shared_value[warp] = best;
        shared_index[warp] = best_index;
      }
      __syncthreads();
      best = shared_value[0];
      best_index = shared_index[0];
      for (int w = 1; w < Group / kWarp; ++w) {
        if (arg_better(is_max, shared_value[w], shared_index[w], best, best_index)) {
          best = shared_value[w];
          best_index = shared_index[w];
        }
      }
    }
    if (g.lane == 0) {
      values[row] = best_index >= 0 ? x[best_index] : cast_to<T>(best);
      indices[row] = best_index < 0 ? 0 : best_index;
    }
  }
}

void arg_reduce_cuda(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in,
                     int64_t outer, int64_t r) {
  if (outer == 0) return;
  KernelContext ctx(in);
  dispatch_all(in.dtype(), "arg_reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* value_data = static_cast<T*>(values.data_ptr());
    int64_t* index_data = static_cast<int64_t*>(indices.data_ptr());
    const T* in_data = static_cast<const T*>(in.data_ptr());
    if (r <= kWarpRowLimit) {
      EMBER_LAUNCH(row_grid<kWarp>(outer), row_block<kWarp>(), 0, ctx.stream,
                   arg_reduce_kernel<kWarp, T>)
      (is_max, value_data, index_data, in_data, outer, r);
    } else {
      EMBER_LAUNCH(row_grid<kBlockGroup>(outer), row_block<kBlockGroup>(), 0, ctx.stream,
                   arg_reduce_kernel<kBlockGroup, T>)
      (is_max, value_data, index_data, in_data, outer, r);
    }
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// --- softmax ---------------------------------------------------------------------------------

// inner == 1: a group of threads per row of n values.
template <int Group, typename T>
__global__ void softmax_rows_kernel(T* out, const T* in, int64_t rows, int64_t n, bool log_output) {
  using A = acc_t<T>;
  EMBER_SHARED(A, shared, [Group == kWarp ? 1 : Group / kWarp]);
  const RowGroup<Group> g;
  for (int64_t row = g.first_row; row < rows; row += g.row_step) {
    const T* x = in + row * n;
    T* y = out + row * n;
    A max_value = -INFINITY;
    for (int64_t j = g.lane; j < n; j += Group) max_value = nan_max(max_value, cast_to<A>(x[j]));
    max_value = group_reduce<Group>(max_value, MaxOp{}, shared);
    A sum = 0;
    for (int64_t j = g.lane; j < n; j += Group) sum += exp(cast_to<A>(x[j]) - max_value);
    sum = group_reduce<Group>(sum, SumOp{}, shared);
    const A log_sum = log(sum);
    for (int64_t j = g.lane; j < n; j += Group) {
      const A shifted = cast_to<A>(x[j]) - max_value;
      y[j] = cast_to<T>(log_output ? shifted - log_sum : exp(shifted) / sum);
    }
  }
}

// inner > 1: one thread per (outer, inner) column, reading along n with stride inner.
template <typename T>
__global__ void softmax_columns_kernel(T* out, const T* in, int64_t outer, int64_t n, int64_t inner,
                                       bool log_output) {
  using A = acc_t<T>;
  const int64_t columns = outer * inner;
  for (int64_t c = global_thread(); c < columns; c += grid_stride()) {
    const int64_t base = (c / inner) * n * inner + c % inner;
    const T* x = in + base;
    T* y = out + base;
    A max_value = -INFINITY;
    for (int64_t j = 0; j < n; ++j) max_value = nan_max(max_value, cast_to<A>(x[j * inner]));
    A sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += exp(cast_to<A>(x[j * inner]) - max_value);
    const A log_sum = log(sum);
    for (int64_t j = 0; j < n; ++j) {
      const A shifted = cast_to<A>(x[j * inner]) - max_value;
      y[j * inner] = cast_to<T>(log_output ? shifted - log_sum : exp(shifted) / sum);
    }
  }
}

void softmax_cuda(const Tensor& out, const Tensor& in, int64_t outer, int64_t n, int64_t inner,
                  bool log_output) {
  if (outer == 0 || n == 0 || inner == 0) return;
  KernelContext ctx(out);
  dispatch_floating(in.dtype(), "softmax", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* out_data = static_cast<T*>(out.data_ptr());
    const T* in_data = static_cast<const T*>(in.data_ptr());
    if (inner == 1) {
      if (n <= kWarpRowLimit) {
        EMBER_LAUNCH(row_grid<kWarp>(outer), row_block<kWarp>(), 0, ctx.stream,
                     softmax_rows_kernel<kWarp, T>)
        (out_data, in_data, outer, n, log_output);
      } else {
        EMBER_LAUNCH(row_grid<kBlockGroup>(outer), row_block<kBlockGroup>(), 0, ctx.stream,
                     softmax_rows_kernel<kBlockGroup, T>)
        (out_data, in_data, outer, n, log_output);
      }
    } else {
      EMBER_LAUNCH(grid_for(outer * inner), kBlockSize, 0, ctx.stream, softmax_columns_kernel<T>)
      (out_data, in_data, outer, n, inner, log_output);
    }
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(reduce) {
  table.reduce = reduce_cuda;
  table.arg_reduce = arg_reduce_cuda;
  table.softmax = softmax_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

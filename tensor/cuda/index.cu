// index_select, gather and scatter_add on contiguous tensors with in-range i64 indices.
#if !defined(EMBER_CUDA_EMULATED)  // (emulated: emulate.h's __half and __nv_bfloat16)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "../detail/dispatch.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

template <typename W>
__global__ void index_select_kernel(W* out, const W* in, const int64_t* index, int64_t total,
                                    int64_t n, int64_t k, int64_t inner) {
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    const int64_t col = i % inner, row = i / inner;
    const int64_t o = row / k, j = row % k;
    out[i] = in[(o * n + index[j]) * inner + col];
  }
}

void index_select_cuda(const Tensor& out, const Tensor& in, const Tensor& index, int64_t /*outer*/,
                       int64_t n, int64_t inner) {
  const int64_t total = out.numel();
  if (total == 0) return;
  KernelContext ctx(out);
  const int64_t k = index.numel();
  dispatch_word(in.dtype(), [&](auto tag) {
    using W = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(total), kBlockSize, 0, ctx.stream, index_select_kernel<W>)
    (static_cast<W*>(out.data_ptr()), static_cast<const W*>(in.data_ptr()),
     static_cast<const int64_t*>(index.data_ptr()), total, n, k, inner);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// Where element i of a contiguous index tensor points into a contiguous data tensor: the
// index's own coordinates in every dim but `dim`, whose coordinate is the index value. The
// data tensor may be larger than the index in every dim.
struct IndexGeometry {
  int ndim = 1;
  int dim = 0;
  int64_t index_sizes[kMaxDims] = {1};
  int64_t data_strides[kMaxDims] = {1};
};

IndexGeometry index_geometry(const Tensor& index, const Tensor& data, int64_t dim) {
  IndexGeometry g;
  if (index.dim() == 0) return g;  // a 0-d gather is a 1-d gather of one element
  EMBER_CHECK(index.dim() <= kMaxDims, "gather", "tensors with more than ", kMaxDims,
              " dims are not supported on CUDA");
  g.ndim = static_cast<int>(index.dim());
  g.dim = static_cast<int>(dim);
  int64_t stride = 1;
  for (int d = g.ndim - 1; d >= 0; --d) {
    g.index_sizes[d] = index.size(d);
    g.data_strides[d] = stride;
    stride *= data.size(d);
  }
  return g;
}

__device__ __forceinline__ int64_t data_offset(const IndexGeometry& g, int64_t i, int64_t value) {
  int64_t offset = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t coord = i % g.index_sizes[d];
    i /= g.index_sizes[d];
    offset += (d == g.dim ? value : coord) * g.data_strides[d];
  }
  return offset;
}

template <typename W>
__global__ void gather_kernel(W* out, const W* in, const int64_t* index, int64_t total,
                              const __grid_constant__ IndexGeometry g) {
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    out[i] = in[data_offset(g, i, index[i])];
  }
}

void gather_cuda(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index) {
  const int64_t total = index.numel();
  if (total == 0) return;
  KernelContext ctx(out);
  const IndexGeometry g = index_geometry(index, in, dim);
  dispatch_word(in.dtype(), [&](auto tag) {
    using W = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(total), kBlockSize, 0, ctx.stream, gather_kernel<W>)
    (static_cast<W*>(out.data_ptr()), static_cast<const W*>(in.data_ptr()),
     static_cast<const int64_t*>(index.data_ptr()), total, g);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

// One byte of an aligned 32-bit word, updated with a compare-and-swap loop.
template <typename Update>
__device__ __forceinline__ void atomic_byte(uint8_t* address, Update update) {
  const auto raw = reinterpret_cast<uintptr_t>(address);
  auto* word = reinterpret_cast<unsigned int*>(raw & ~uintptr_t{3});
  const unsigned shift = static_cast<unsigned>(raw & 3u) * 8u;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    const unsigned byte = update((assumed >> shift) & 0xffu) & 0xffu;
    old = atomicCAS(word, assumed, (assumed & ~(0xffu << shift)) | (byte << shift));
  } while (assumed != old);
}

template <typename T>
__device__ __forceinline__ void atomic_add(T* address, T value) {
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double> ||
                std::is_same_v<T, int32_t>) {
    atomicAdd(address, value);
  } else if constexpr (std::is_same_v<T, int64_t>) {  // two's complement: unsigned add is the same
    atomicAdd(reinterpret_cast<unsigned long long*>(address),
              static_cast<unsigned long long>(value));
  } else if constexpr (std::is_same_v<T, Half>) {
    atomicAdd(reinterpret_cast<__half*>(address), __ushort_as_half(value.bits));
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    atomicAdd(reinterpret_cast<__nv_bfloat16*>(address), __ushort_as_bfloat16(value.bits));
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    atomic_byte(address, [value](unsigned byte) { return byte + value; });
  } else {  // bool: adding is a logical or
    atomic_byte(reinterpret_cast<uint8_t*>(address),
                [value](unsigned byte) { return (byte != 0u || value) ? 1u : 0u; });
  }
}

template <typename T>
__global__ void scatter_add_kernel(T* self, const T* src, const int64_t* index, int64_t total,
                                   const __grid_constant__ IndexGeometry g) {
  for (int64_t i = global_thread(); i < total; i += grid_stride()) {
    atomic_add(self + data_offset(g, i, index[i]), src[i]);
  }
}

void scatter_add_cuda(const Tensor& self, int64_t dim, const Tensor& index, const Tensor& src) {
  const int64_t total = index.numel();
  if (total == 0) return;
  KernelContext ctx(self);
  const IndexGeometry g = index_geometry(index, self, dim);
  dispatch_all(self.dtype(), "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    EMBER_LAUNCH(grid_for(total), kBlockSize, 0, ctx.stream, scatter_add_kernel<T>)
    (static_cast<T*>(self.data_ptr()), static_cast<const T*>(src.data_ptr()),
     static_cast<const int64_t*>(index.data_ptr()), total, g);
    EMBER_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(index) {
  table.index_select = index_select_cuda;
  table.gather = gather_cuda;
  table.scatter_add = scatter_add_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

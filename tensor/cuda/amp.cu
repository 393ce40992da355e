// CUDA kernel for loss scaling: the inf/NaN check and unscale of every gradient of a step in
// ONE launch, whatever their number, sizes and dtypes (a multi-tensor kernel: each block
// takes chunks of the tensors from a table in device memory).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../detail/dispatch.h"
#include "../ops.h"
#include "cuda_kernels.h"
#include "launch.cuh"

namespace ember::detail {
namespace {

inline constexpr int64_t kChunk = 16384;  // elements a block handles per chunk

// Columns of the tensor table: data pointer, element count, dtype, and the prefix sum of
// chunk counts (chunk c belongs to the tensor whose range [prefix[t], prefix[t + 1]) holds it).
struct TensorTable {
  const int64_t* ptr;
  const int64_t* numel;
  const int64_t* dtype;
  const int64_t* chunk_prefix;  // num_tensors + 1 entries
  int64_t num_tensors;
};

template <typename T>
__device__ __forceinline__ void check_and_unscale(T* data, int64_t begin, int64_t end, float inv,
                                                  bool& non_finite) {
  using C = compute_t<T>;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const C value = cast_to<C>(data[i]);
    if (!isfinite(value)) non_finite = true;
    if (inv != 1.f) data[i] = cast_to<T>(value * static_cast<C>(inv));
  }
}

__global__ void non_finite_check_and_unscale_kernel(TensorTable table, int64_t num_chunks,
                                                    float* found_inf, const float* inv_scale) {
  const float inv = *inv_scale;
  bool non_finite = false;
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    // The tensor holding chunk c: the last t with chunk_prefix[t] <= c.
    int64_t lo = 0, hi = table.num_tensors - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (table.chunk_prefix[mid] <= c)
        lo = mid;
      else
        hi = mid - 1;
    }
    const int64_t begin = (c - table.chunk_prefix[lo]) * kChunk;
    const int64_t end = begin + kChunk < table.numel[lo] ? begin + kChunk : table.numel[lo];
    void* data = reinterpret_cast<void*>(table.ptr[lo]);
    switch (static_cast<DType>(table.dtype[lo])) {
      case DType::kFloat32:
        check_and_unscale(static_cast<float*>(data), begin, end, inv, non_finite);
        break;
      case DType::kFloat64:
        check_and_unscale(static_cast<double*>(data), begin, end, inv, non_finite);
        break;
      case DType::kFloat16:
        check_and_unscale(static_cast<Half*>(data), begin, end, inv, non_finite);
        break;
      case DType::kBFloat16:
        check_and_unscale(static_cast<BFloat16*>(data), begin, end, inv, non_finite);
        break;
      default:
        break;  // the front end admits floating tensors only
    }
  }
  if (non_finite) *found_inf = 1.f;  // every writer stores the same value
}

void amp_non_finite_check_and_unscale(const std::vector<Tensor>& tensors, const Tensor& found_inf,
                                      const Tensor& inv_scale) {
  std::vector<const Tensor*> live;
  for (const Tensor& t : tensors) {
    if (t.numel() > 0) live.push_back(&t);
  }
  if (live.empty()) return;
  const auto n = static_cast<int64_t>(live.size());
  // One host table, one copy to the device (stream-ordered before the launch), one launch.
  std::vector<int64_t> host(static_cast<size_t>(4 * n + 1));
  int64_t chunks = 0;
  for (int64_t t = 0; t < n; ++t) {
    const Tensor& x = *live[static_cast<size_t>(t)];
    host[static_cast<size_t>(t)] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(x.data_ptr()));
    host[static_cast<size_t>(n + t)] = x.numel();
    host[static_cast<size_t>(2 * n + t)] = static_cast<int64_t>(x.dtype());
    host[static_cast<size_t>(3 * n + t)] = chunks;
    chunks += (x.numel() + kChunk - 1) / kChunk;
  }
  host[static_cast<size_t>(4 * n)] = chunks;
  KernelContext ctx(found_inf);
  const Tensor table_dev = empty({4 * n + 1}, TensorOptions(kI64, found_inf.device()));
  EMBER_CUDA_CHECK(cudaMemcpyAsync(table_dev.data_ptr(), host.data(), host.size() * sizeof(int64_t),
                                   cudaMemcpyHostToDevice, ctx.stream));
  const int64_t* base = static_cast<const int64_t*>(table_dev.data_ptr());
  const TensorTable table{base, base + n, base + 2 * n, base + 3 * n, n};
  const auto grid = static_cast<unsigned>(std::min<int64_t>(chunks, kMaxGridBlocks));
  non_finite_check_and_unscale_kernel<<<grid, kBlockSize, 0, ctx.stream>>>(
      table, chunks, static_cast<float*>(found_inf.data_ptr()),
      static_cast<const float*>(inv_scale.data_ptr()));
  EMBER_CUDA_CHECK_LAUNCH();
  // A pageable source is copied out before cudaMemcpyAsync returns, so `host` may go; the
  // table's device block returns to the stream's cache and is reused only after the kernel.
}

}  // namespace

void register_cuda_amp_kernels(KernelTable& table) {
  table.amp_non_finite_check_and_unscale = amp_non_finite_check_and_unscale;
}

}  // namespace ember::detail

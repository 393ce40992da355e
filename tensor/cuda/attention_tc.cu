// The tensor-core attention kernels (attention_tc.cuh) on the GPU: the device execution
// context (mma.sync through inline PTX), one __global__ wrapper per body, and the launches.
#include "attention_tc.cuh"  // (first: philox.h's math before ops.h's overloads)

#include <algorithm>
#include <climits>
#include <cstdint>
#include <mutex>
#include <set>
#include <type_traits>
#include <utility>
#include <vector>

#include "../cuda.h"
#include "../detail/dispatch.h"
#include "../ops.h"
#include "device.cuh"

EMBER_KERNELS_BEGIN
namespace {

namespace tc = attention_tc;

// What the kernel bodies ask of a thread: its index in the block, the block barrier, a warp
// shuffle, asynchronous 16-byte copies into shared memory (cp.async), four 8x8 16-bit
// matrices from shared memory (ldmatrix, plain or transposed) and D += A B on the tensor
// cores (mma.sync m16n8k16, f32 accumulators).
struct DeviceCtx {
  __device__ __forceinline__ int thread() const { return static_cast<int>(threadIdx.x); }
  __device__ __forceinline__ void sync() const { __syncthreads(); }
  __device__ __forceinline__ float shfl_xor(float v, int mask) const {
    return __shfl_xor_sync(0xffffffffu, v, mask);
  }
  // 16 (or 4) bytes global -> shared without passing through registers (cp.async; zeros when
  // !valid, src then only has to be a valid address), grouped per thread: commit closes a
  // group, wait_newest_pending waits for all but the newest one.
  __device__ __forceinline__ void copy16_async(uint16_t* dst, const uint16_t* src,
                                               bool valid) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(src),
                 "r"(valid ? 16 : 0));
#elif defined(EMBER_CUDA_EMULATED)
    cuda_emu::cp_async(dst, src, 16, valid);
#else
    (void)dst;
    (void)src;
    (void)valid;
    __trap();
#endif
  }
  __device__ __forceinline__ void copy4_async(float* dst, const float* src, bool valid) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(src),
                 "r"(valid ? 4 : 0));
#elif defined(EMBER_CUDA_EMULATED)
    cuda_emu::cp_async(dst, src, 4, valid);
#else
    (void)dst;
    (void)src;
    (void)valid;
    __trap();
#endif
  }
  __device__ __forceinline__ void commit() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#elif defined(EMBER_CUDA_EMULATED)
    cuda_emu::cp_async_commit();
#endif
  }
  __device__ __forceinline__ void wait_newest_pending() const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
#elif defined(EMBER_CUDA_EMULATED)
    cuda_emu::cp_async_wait(1);
#endif
  }
  __device__ __forceinline__ void ldsm(uint32_t (&r)[4], const uint16_t* row) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#elif defined(EMBER_CUDA_EMULATED)
    cuda_emu::ldmatrix_x4(r, row, false);
#else
    (void)row;
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#endif
  }
  __device__ __forceinline__ void ldsm_t(uint32_t (&r)[4], const uint16_t* row) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const auto address = static_cast<uint32_t>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#elif defined(EMBER_CUDA_EMULATED)
    cuda_emu::ldmatrix_x4(r, row, true);
#else
    (void)row;
    r[0] = r[1] = r[2] = r[3] = 0;
    __trap();
#endif
  }
  template <typename T>
  __device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4],
                                      const uint32_t (&b)[2]) const {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (std::is_same_v<T, BFloat16>) {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    } else {
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
          "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
#elif defined(EMBER_CUDA_EMULATED)
    cuda_emu::mma_m16n8k16(d, a, b, std::is_same_v<T, BFloat16>);
#else
    // Built for an older GPU: the host never launches these there (supported() checks 8.0).
    (void)d;
    (void)a;
    (void)b;
    __trap();
#endif
  }
};

template <typename T, int D, bool kDropout>
__global__ void __launch_bounds__(tc::kThreads)
    forward_kernel(const __grid_constant__ tc::Params p) {
  EMBER_DYNAMIC_SHARED(unsigned char, tc_smem);
  tc::forward_block<T, D, kDropout>(DeviceCtx{}, p, blockIdx.x, tc_smem);
}

template <typename T, int D>
__global__ void __launch_bounds__(tc::kThreads)
    row_dot_kernel(const __grid_constant__ tc::Params p) {
  tc::row_dot_block<T, D>(DeviceCtx{}, p, blockIdx.x);
}

template <typename T, int D, bool kDropout>
__global__ void __launch_bounds__(tc::kThreads)
    grad_q_kernel(const __grid_constant__ tc::Params p) {
  EMBER_DYNAMIC_SHARED(unsigned char, tc_smem);
  tc::grad_q_block<T, D, kDropout>(DeviceCtx{}, p, blockIdx.x, tc_smem);
}

template <typename T, int D, bool kDropout>
__global__ void __launch_bounds__(tc::kThreads)
    grad_kv_kernel(const __grid_constant__ tc::Params p) {
  EMBER_DYNAMIC_SHARED(unsigned char, tc_smem);
  tc::grad_kv_block<T, D, kDropout>(DeviceCtx{}, p, blockIdx.x, tc_smem);
}

using Kernel = void (*)(tc::Params);

// Lets `kernel` use `smem` bytes of dynamic shared memory on the current device (more than the
// default 48 KiB needs asking), once per kernel and device.
void allow_shared_memory(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return;
  int device = 0;
  EMBER_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::set<std::pair<Kernel, int>> raised;
  const std::lock_guard<std::mutex> lock(mutex);
  if (raised.count({kernel, device}) != 0) return;
  EMBER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(smem)));
  raised.insert({kernel, device});
}

// Launches `kernel` on `blocks` blocks of kThreads with `smem` bytes of dynamic shared memory.
void launch(Kernel kernel, int64_t blocks, size_t smem, cudaStream_t stream, const tc::Params& p) {
  if (blocks == 0) return;
  allow_shared_memory(kernel, smem);
  EMBER_LAUNCH(static_cast<unsigned>(blocks), tc::kThreads, smem, stream, kernel)(p);
  EMBER_CUDA_CHECK_LAUNCH();
}

// f(type tag, head dim constant, dropout constant) for the supported (dtype, head dim) pairs.
template <typename F>
void dispatch_config(DType dtype, int64_t dim, bool dropout, F&& f) {
  const auto with_dropout = [&](auto tag, auto d) {
    if (dropout) {
      f(tag, d, std::true_type{});
    } else {
      f(tag, d, std::false_type{});
    }
  };
  const auto with_dim = [&](auto tag) {
    if (dim == 64) {
      with_dropout(tag, std::integral_constant<int, 64>{});
    } else {
      with_dropout(tag, std::integral_constant<int, 128>{});
    }
  };
  if (dtype == kBF16) {
    with_dim(TypeTag<BFloat16>{});
  } else {
    with_dim(TypeTag<Half>{});
  }
}

tc::Params params_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                     const AttentionParams& a) {
  tc::Params p = tc::params_for(a, q.size(0), q.size(1), k.size(1));
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.lse = lse.data_ptr<float>();
  return p;
}

// Compute capability 8.0 or newer (mma.sync with bf16), per device, asked once.
bool has_bf16_tensor_cores(int device) {
  static const std::vector<int> majors = [] {
    std::vector<int> result;
    for (int d = 0; d < cuda::device_count(); ++d)
      result.push_back(cuda::device_capability(d).first);
    return result;
  }();
  return device >= 0 && device < static_cast<int>(majors.size()) && majors[device] >= 8;
}

}  // namespace

bool attention_tc_supported(const Tensor& q, const Tensor& k, const Tensor& v,
                            std::initializer_list<const Tensor*> others) {
  if (q.dtype() != kBF16 && q.dtype() != kF16) return false;
  const int64_t dim = q.size(2);
  if ((dim != 64 && dim != 128) || v.size(2) != dim) return false;
  if (q.size(0) == 0 || q.size(1) == 0 || k.size(1) == 0) return false;
  // Block counts fit the grid's x dimension.
  const int64_t rows = std::max(q.size(1), k.size(1));
  if (q.size(0) * tc::ceil_div(rows, tc::kBlockRows) > INT_MAX) return false;
  const auto aligned = [](const Tensor& t) {
    return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
  };
  if (!aligned(q) || !aligned(k) || !aligned(v)) return false;
  for (const Tensor* t : others) {
    if (!aligned(*t)) return false;
  }
  return has_bf16_tensor_cores(q.device().index);
}

void attention_tc_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                          const Tensor& v, const AttentionParams& params) {
  const KernelContext ctx(q);
  tc::Params p = params_of(q, k, v, lse, params);
  p.out = out.data_ptr();
  dispatch_config(q.dtype(), q.size(2), p.dropout, [&](auto tag, auto dim, auto dropout) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    constexpr bool kDropout = decltype(dropout)::value;
    launch(forward_kernel<T, D, kDropout>, tc::forward_blocks<D>(p), tc::forward_smem_bytes<D>(),
           ctx.stream, p);
  });
}

void attention_tc_backward(const Tensor& grad_q, const Tensor& grad_k, const Tensor& grad_v,
                           const Tensor& grad_out, const Tensor& q, const Tensor& k,
                           const Tensor& v, const Tensor& out, const Tensor& lse,
                           const AttentionParams& params) {
  const KernelContext ctx(q);
  const Tensor dsum = empty({q.size(0) * q.size(1)}, TensorOptions(kF32, q.device()));
  tc::Params p = params_of(q, k, v, lse, params);
  p.out = out.data_ptr();
  p.grad_out = grad_out.data_ptr();
  p.dsum = dsum.data_ptr<float>();
  p.grad_q = grad_q.data_ptr();
  p.grad_k = grad_k.data_ptr();
  p.grad_v = grad_v.data_ptr();
  dispatch_config(q.dtype(), q.size(2), p.dropout, [&](auto tag, auto dim, auto dropout) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    constexpr bool kDropout = decltype(dropout)::value;
    launch(row_dot_kernel<T, D>, tc::row_dot_blocks(p), 0, ctx.stream, p);
    launch(grad_q_kernel<T, D, kDropout>, tc::grad_q_blocks<D>(p), tc::grad_q_smem_bytes<D>(),
           ctx.stream, p);
    launch(grad_kv_kernel<T, D, kDropout>, tc::grad_kv_blocks(p), tc::grad_kv_smem_bytes<D>(),
           ctx.stream, p);
  });
}

EMBER_KERNELS_END  // namespace ember::detail

// CUDA C++ on the CPU: what a kernel file under tensor/cuda/ sees in place of the CUDA
// runtime when it is compiled as host C++ with EMBER_CUDA_EMULATED defined (device.cuh picks
// this header). Private to tensor/cuda/ and the emulated tests (tests/tensor/cuda_emulated/).
//
// Design, for a kernel author:
// - Write kernels as usual CUDA C++, and launch them with EMBER_LAUNCH(grid, block,
//   dynamic_shared_bytes, stream, kernel)(args...), which is kernel<<<grid, block, bytes,
//   stream>>>(args...) under nvcc (same tokens, so the GPU build's code does not change) and
//   an emulated launch here. Shared memory is EMBER_SHARED(type, name, [dims]) (nvcc:
//   __shared__ type name[dims]) and EMBER_DYNAMIC_SHARED(type, name) (extern, dynamic);
//   namespaces open and close with EMBER_KERNELS_BEGIN / EMBER_KERNELS_END, which put the
//   emulated copy in ember::detail::emulated so it links beside libember's real kernels.
// - A launch runs the blocks one after another on the calling thread; the threads of a block
//   are fibers (ucontext) that switch only at __syncthreads, warp collectives (shuffles,
//   votes, __syncwarp, ldmatrix, mma) and the end of the thread. Between two barriers each
//   warp in turn runs as far as it can (its collectives complete as soon as its lanes all
//   arrive), warps and lanes in an order that flips at every barrier: forward (thread 0
//   first) then reverse, or the other way round (set_order; unset, launches alternate). The
//   emulated tests run every op in both orders, so a read of shared memory that another warp
//   writes without a barrier between them sees a value from before the write.
// - Shared memory, EMBER_SHARED(type, name, [dims]) or EMBER_DYNAMIC_SHARED(type, name), is
//   the launch's own and poisoned (every byte 0xff: NaN for floats, -1 for integers) when each
//   block starts, so a read before any write of the block sees poison. cp_async poisons its
//   destination at once and lands the copy only when cp_async_wait lets it (or when the
//   thread ends), so a missing wait reads NaN.
// - Reported as an ember::Error naming the kernel: a __syncthreads that not every thread of
//   the block reaches (one exited, or waits in a warp collective), a warp collective whose
//   mask leaves out the calling lane or names a lane that does not come, a shuffle reading a
//   lane outside the mask, a launch configuration the GPU would refuse, __trap().
// - The grid-stride cap kMaxGridBlocks (launch.cuh) is kEmulatedMaxGridBlocks here, so small
//   tensors already take the grid-stride loops.
// - Atomics are atomic because only one fiber runs at a time.
// - GPU-library code in a kernel file (cuBLAS, cuDNN) sits in #if !defined(EMBER_CUDA_EMULATED)
//   blocks; what ember writes stays outside them, reachable from the host launchers.
// - Every kernel needs an emulated test in tests/tensor/cuda_emulated/ (parity with the CPU
//   kernels in both orders, and PlantedBug runs that must fail):
//   scripts/check_emulated_coverage.sh fails CI for a kernel none runs.
// What stays GPU-only: cuBLAS/cuBLASLt, cuDNN, NCCL, CUDA graphs, streams and events, the
// caching allocator; the memory model beyond barriers (fences, volatile); timing.
#pragma once

#include <math.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

#include "../../dtype.h"
#include "../../error.h"
#include "../../tensor.h"

// --- the language ------------------------------------------------------------------------

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __grid_constant__
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
// Shared memory is declared with EMBER_SHARED / EMBER_DYNAMIC_SHARED (device.cuh), so the
// emulation can give each launch its own and poison it per block: a bare __shared__ is an
// error here.
#define __shared__ __shared___is_not_emulated__declare_with_EMBER_SHARED

struct uint3 {
  unsigned x = 0, y = 0, z = 0;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct double2 {
  double x, y;
};
inline double2 make_double2(double x, double y) { return {x, y}; }
inline uint3 threadIdx, blockIdx;  // set by the runtime before each thread runs
inline dim3 blockDim, gridDim;
inline constexpr int warpSize = 32;

namespace ember::cuda_emu {

inline constexpr int kWarpSize = 32;
inline constexpr int64_t kEmulatedMaxGridBlocks = 3;

// Runs thread() for every thread of every block of the grid (see the design note above);
// `kernel` names it in errors.
void launch(const char* kernel, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
            const std::function<void()>& thread);
// Which order a block's threads start in (each barrier flips it).
enum class Order { kAlternate, kForwardFirst, kReverseFirst };
void set_order(Order order);

// This block's dynamic shared memory (16-byte aligned).
void* dynamic_shared();
// This launch's `bytes` of static shared memory named by `key` (16-byte aligned, poisoned at
// every block's start).
void* static_shared(const void* key, size_t bytes);
// The calling thread's lane in its warp.
int lane();
// Block barrier.
void syncthreads();

// A warp collective: every lane named in `mask` calls it with the same mask and resolver; once
// all have, resolve(io, mask) runs once with io[l] the pointer lane l passed (null for lanes
// outside the mask) and computes every lane's result into its own io.
using Resolve = void (*)(void* const* io, unsigned mask);
void warp_collective(const char* what, unsigned mask, void* io, Resolve resolve);

// cp.async: `bytes` from src to dst (zeros when !valid), landing at cp_async_wait; commit
// closes the calling thread's open group; wait(n) lands all but the newest n groups.
void cp_async(void* dst, const void* src, size_t bytes, bool valid);
void cp_async_commit();
void cp_async_wait(int pending);

[[noreturn]] void trap();

// Bugs a test plants in every emulated launch while a PlantedBug lives, to show that the
// emulated tests of a kernel fail when the kernel has them:
//   kMissingBarrier    each thread skips its `which`-th __syncthreads (from 0)
//   kWrongShuffleMask  warp collectives drop lane 31 from their mask
//   kMissingCpAsyncWait  cp_async_wait lands nothing (copies land when the thread ends)
//   kLostTailThread    the grid's last thread returns at once, as a tail bound off by one
// hits() counts the times the bug changed what ran (0: the test planted it where nothing
// runs it, and proves nothing).
enum class Bug { kMissingBarrier, kWrongShuffleMask, kMissingCpAsyncWait, kLostTailThread };
class PlantedBug {
 public:
  explicit PlantedBug(Bug bug, int which = 0);
  ~PlantedBug();
  PlantedBug(const PlantedBug&) = delete;
  PlantedBug& operator=(const PlantedBug&) = delete;
  int64_t hits() const;
};

// Shuffles: lane reads lane `src` of its warp (src computed by the caller from CUDA's rules).
template <typename T>
struct ShuffleIo {
  T value;
  int src;
  const char* what;
  T result;
};
template <typename T>
void resolve_shuffle(void* const* io, unsigned mask) {
  for (int l = 0; l < kWarpSize; ++l) {
    if (io[l] == nullptr) continue;
    auto* me = static_cast<ShuffleIo<T>*>(io[l]);
    EMBER_CHECK(io[me->src] != nullptr, me->what, "lane ", l, " reads lane ", me->src,
                " outside the mask 0x", std::hex, mask);
    me->result = static_cast<ShuffleIo<T>*>(io[me->src])->value;
  }
}
template <typename T>
T shuffle(const char* what, unsigned mask, T value, int src) {
  ShuffleIo<T> io{value, src, what, T{}};
  warp_collective(what, mask, &io, resolve_shuffle<T>);
  return io.result;
}

// Votes: every lane gets the ballot of the mask's lanes.
struct VoteIo {
  bool predicate;
  unsigned ballot;
};
void resolve_vote(void* const* io, unsigned mask);
unsigned vote(const char* what, unsigned mask, bool predicate);

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane l gives the address of row l % 8 of
// matrix l / 8; register i of lane l receives matrix i's elements (row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1), low half first, or, transposed, (rows 2 (l % 4) and
// 2 (l % 4) + 1, column l / 4).
void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row, bool transposed);

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}: d += A B for a 16x16 A and 16x8 B spread
// over the warp's registers as the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating
// point type" lays them out.
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], bool bf16);

// Builds the emulated launch EMBER_LAUNCH expands to.
template <typename Kernel>
struct Launcher {
  const char* name;
  dim3 grid, block;
  size_t shared_bytes;
  Kernel kernel;
  template <typename... Args>
  void operator()(Args... args) const {
    launch(name, grid, block, shared_bytes, [&] { kernel(args...); });
  }
};
template <typename G, typename B, typename S, typename Stream, typename Kernel>
Launcher<Kernel> make_launcher(const char* name, G grid, B block, S shared_bytes, Stream,
                               Kernel kernel) {
  const auto to_dim3 = [](auto d) {
    if constexpr (std::is_same_v<decltype(d), dim3>) {
      return d;
    } else {
      return dim3(static_cast<unsigned>(d));
    }
  };
  return {name, to_dim3(grid), to_dim3(block), static_cast<size_t>(shared_bytes), kernel};
}

}  // namespace ember::cuda_emu

#define EMBER_LAUNCH(grid, block, shared_bytes, stream, ...)                        \
  ::ember::cuda_emu::make_launcher(#__VA_ARGS__, grid, block, shared_bytes, stream, \
                                   [&](auto... ember_args_) { __VA_ARGS__(ember_args_...); })
#define EMBER_SHARED(type, name, dims)                          \
  using name##_shared_type = type dims;                         \
  static const char name##_shared_key = 0;                      \
  name##_shared_type& name = *static_cast<name##_shared_type*>( \
      ::ember::cuda_emu::static_shared(&name##_shared_key, sizeof(name##_shared_type)))
#define EMBER_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::ember::cuda_emu::dynamic_shared())
#define EMBER_KERNELS_BEGIN namespace ember::detail::emulated {
#define EMBER_KERNELS_END }

// --- device functions ----------------------------------------------------------------------

inline void __syncthreads() { ::ember::cuda_emu::syncthreads(); }
[[noreturn]] inline void __trap() { ::ember::cuda_emu::trap(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)::ember::cuda_emu::vote("__syncwarp", mask, true);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::ember::cuda_emu::vote("__ballot_sync", mask, predicate != 0);
}
inline int __any_sync(unsigned mask, int predicate) {
  return ::ember::cuda_emu::vote("__any_sync", mask, predicate != 0) != 0u;
}
inline int __all_sync(unsigned mask, int predicate) {
  return ::ember::cuda_emu::vote("__all_sync", mask, predicate != 0) == mask;
}

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane, int width = warpSize) {
  const int lane = ::ember::cuda_emu::lane(), base = lane & ~(width - 1);
  return ::ember::cuda_emu::shuffle("__shfl_sync", mask, value, base + (src_lane & (width - 1)));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = warpSize) {
  const int lane = ::ember::cuda_emu::lane(), base = lane & ~(width - 1);
  const int src = lane ^ lane_mask;
  return ::ember::cuda_emu::shuffle("__shfl_xor_sync", mask, value,
                                    src >= base + width ? lane : src);
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  const int lane = ::ember::cuda_emu::lane(), base = lane & ~(width - 1);
  const int src = lane + static_cast<int>(delta);
  return ::ember::cuda_emu::shuffle("__shfl_down_sync", mask, value,
                                    src >= base + width ? lane : src);
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = warpSize) {
  const int lane = ::ember::cuda_emu::lane(), base = lane & ~(width - 1);
  const int src = lane - static_cast<int>(delta);
  return ::ember::cuda_emu::shuffle("__shfl_up_sync", mask, value, src < base ? lane : src);
}

// CUDA's global min/max overloads (floating: fminf/fmaxf, a NaN loses).
inline float max(float a, float b) { return fmaxf(a, b); }
inline double max(double a, double b) { return fmax(a, b); }
inline float min(float a, float b) { return fminf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline int max(int a, int b) { return a > b ? a : b; }
inline int min(int a, int b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }

// Atomics: plain read-modify-writes (one fiber runs at a time).
template <typename T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = static_cast<T>(old + value);
  return old;
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
  const T old = *address;
  if (old == compare) *address = value;
  return old;
}
template <typename T>
T atomicExch(T* address, T value) {
  const T old = *address;
  *address = value;
  return old;
}
template <typename T>
T atomicMax(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}
template <typename T>
T atomicMin(T* address, T value) {
  const T old = *address;
  if (value < old) *address = value;
  return old;
}

// The 16-bit float types of cuda_fp16.h / cuda_bf16.h are ember's own here; an atomic add on
// them rounds the float sum to nearest even, as the hardware's does.
using __half = ::ember::Half;
using __nv_bfloat16 = ::ember::BFloat16;
inline __half __ushort_as_half(unsigned short bits) {
  __half h;
  h.bits = bits;
  return h;
}
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
  __nv_bfloat16 b;
  b.bits = bits;
  return b;
}

// --- the runtime API the host launchers use ----------------------------------------------

struct ember_emulated_stream;
using cudaStream_t = ember_emulated_stream*;
enum cudaError_t { cudaSuccess = 0 };
enum cudaMemcpyKind {
  cudaMemcpyHostToHost,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice,
  cudaMemcpyDefault
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize };

inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                                   cudaStream_t) {
  if (bytes != 0) std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
inline cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t) {
  if (bytes != 0) std::memset(ptr, value, bytes);
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel, cudaFuncAttribute, int) {
  return cudaSuccess;
}

#define EMBER_CUDA_CHECK(expr) \
  EMBER_ASSERT((expr) == cudaSuccess, "emulated CUDA call failed: ", #expr)
#define EMBER_CUDA_CHECK_LAUNCH() \
  do {                            \
  } while (0)

namespace ember::detail::emulated {

// The kernels' KernelContext (cuda_context.h): emulated kernels take CPU tensors.
struct KernelContext {
  explicit KernelContext(const Tensor& t) : KernelContext(t.device()) {}
  explicit KernelContext(Device device) : stream(nullptr) {
    EMBER_CHECK(device.is_cpu(), "emulated CUDA kernel", "takes CPU tensors, got ", device);
  }
  cudaStream_t stream;
};

}  // namespace ember::detail::emulated

// CUDA kernels for loss scaling: the inf/NaN check and unscale of every gradient of a step
// through multi_tensor_apply, one pass per dtype among the gradients (a few launches for all
// of them, never one per tensor), as PyTorch's _amp_foreach_non_finite_check_and_unscale_;
// and the scale's update in one thread. The scale is read and the flag written on the
// device, so a step can be graph-captured.
#include <array>
#include <cstdint>
#include <vector>

#include "../detail/amp_math.h"
#include "../detail/dispatch.h"
#include "../ops.h"
#include "multi_tensor_apply.cuh"

EMBER_KERNELS_BEGIN
namespace {

constexpr int kUnscaleMaxTensors = 110;  // 1 list: 110 * (8 + 8) bytes of addresses and sizes

// Each element is read in its compute type (float for f16/bf16/f32, double for f64),
// flagged when not finite, and multiplied by *inv_scale unless that is exactly 1 (a disabled
// scale leaves the bits untouched), as the CPU kernel.
template <typename T>
struct CheckAndUnscaleOp {
  using C = acc_t<T>;
  float* found_inf;
  const float* inv_scale;

  __device__ void operator()(const TensorListMeta<1, NoExtra, kUnscaleMaxTensors>& meta, int tensor,
                             int64_t begin, int64_t end) const {
    T* x = list_ptr<T>(meta, 0, tensor);
    const float inv = *inv_scale;
    bool non_finite = false;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const C value = cast_to<C>(x[i]);
      if (!isfinite(value)) non_finite = true;
      if (inv != 1.f) x[i] = cast_to<T>(value * static_cast<C>(inv));
    }
    if (non_finite) *found_inf = 1.f;  // every writer stores the same value
  }
};

void amp_non_finite_check_and_unscale_cuda(const std::vector<Tensor>& tensors,
                                           const Tensor& found_inf, const Tensor& inv_scale) {
  const KernelContext ctx(found_inf);
  float* found = static_cast<float*>(found_inf.data_ptr());
  const auto* inv = static_cast<const float*>(inv_scale.data_ptr());
  for (const DType dtype : {kF32, kF16, kBF16, kF64}) {
    std::vector<std::array<void*, 1>> addresses;
    std::vector<int64_t> numels;
    for (const Tensor& t : tensors) {
      if (t.dtype() != dtype || t.numel() == 0) continue;
      addresses.push_back({t.data_ptr()});
      numels.push_back(t.numel());
    }
    if (numels.empty()) continue;
    const std::vector<NoExtra> extras(numels.size());
    dispatch_floating(dtype, "_amp_foreach_non_finite_check_and_unscale_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      multi_tensor_apply<1, NoExtra, kUnscaleMaxTensors>(
          ctx.stream, std::span<const std::array<void*, 1>>(addresses), numels,
          std::span<const NoExtra>(extras), CheckAndUnscaleOp<T>{found, inv});
    });
  }
}

__global__ void amp_update_scale_kernel(float* scale, int32_t* tracker, const float* found_inf,
                                        double growth_factor, double backoff_factor,
                                        int64_t growth_interval) {
  amp_update_scale_value(*scale, *tracker, *found_inf, growth_factor, backoff_factor,
                         growth_interval);
}

void amp_update_scale_cuda(const Tensor& scale, const Tensor& growth_tracker,
                           const Tensor& found_inf, double growth_factor, double backoff_factor,
                           int64_t growth_interval) {
  const KernelContext ctx(scale);
  EMBER_LAUNCH(1, 1, 0, ctx.stream, amp_update_scale_kernel)
  (static_cast<float*>(scale.data_ptr()), static_cast<int32_t*>(growth_tracker.data_ptr()),
   static_cast<const float*>(found_inf.data_ptr()), growth_factor, backoff_factor, growth_interval);
  EMBER_CUDA_CHECK_LAUNCH();
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(amp) {
  table.amp_non_finite_check_and_unscale = amp_non_finite_check_and_unscale_cuda;
  table.amp_update_scale = amp_update_scale_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

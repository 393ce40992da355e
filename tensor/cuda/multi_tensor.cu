// CUDA multi-tensor optimizer updates: SGD and Adam/AdamW over all tensors of a call in
// ceil(chunks / 320) launches of multi_tensor_apply, the element math shared with the CPU
// loop (detail/multi_tensor_math.h).
#include <array>
#include <vector>

#include "../detail/dispatch.h"
#include "../detail/multi_tensor_math.h"
#include "multi_tensor_apply.cuh"

namespace ember::detail {
namespace {

constexpr int kSGDMaxTensors = 64;   // 3 lists
constexpr int kAdamMaxTensors = 36;  // 5 lists and two scalars per tensor

struct SGDExtra {
  int32_t fresh;  // the momentum buffer is new: it takes the gradient
};

template <typename T>
struct SGDOp {
  using A = compute_t<T>;
  SGDConsts<A> c;

  __device__ void operator()(const TensorListMeta<3, SGDExtra, kSGDMaxTensors>& meta, int tensor,
                             int64_t begin, int64_t end) const {
    T* p = list_ptr<T>(meta, 0, tensor);
    const T* g = list_ptr<T>(meta, 1, tensor);
    T* b = list_ptr<T>(meta, 2, tensor);
    const bool fresh = meta.extra[tensor].fresh != 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      A buffer = (c.has_momentum && !fresh) ? cast_to<A>(b[i]) : A(0);
      p[i] = cast_to<T>(sgd_element<A>(cast_to<A>(p[i]), cast_to<A>(g[i]), buffer, fresh, c));
      if (c.has_momentum) b[i] = cast_to<T>(buffer);
    }
  }
};

template <typename T>
struct AdamOp {
  using A = compute_t<T>;
  AdamConsts<A> c;

  __device__ void operator()(const TensorListMeta<5, AdamStepConsts<A>, kAdamMaxTensors>& meta,
                             int tensor, int64_t begin, int64_t end) const {
    T* p = list_ptr<T>(meta, 0, tensor);
    const T* g = list_ptr<T>(meta, 1, tensor);
    T* m = list_ptr<T>(meta, 2, tensor);
    T* v = list_ptr<T>(meta, 3, tensor);
    T* v_max = list_ptr<T>(meta, 4, tensor);
    const AdamStepConsts<A> s = meta.extra[tensor];
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      A mi = cast_to<A>(m[i]), vi = cast_to<A>(v[i]);
      A vmi = c.amsgrad ? cast_to<A>(v_max[i]) : A(0);
      p[i] = cast_to<T>(adam_element<A>(cast_to<A>(p[i]), cast_to<A>(g[i]), mi, vi, vmi, c, s));
      m[i] = cast_to<T>(mi);
      v[i] = cast_to<T>(vi);
      if (c.amsgrad) v_max[i] = cast_to<T>(vmi);
    }
  }
};

}  // namespace

void cuda_multi_tensor_sgd(std::span<const Tensor> params, std::span<const Tensor> grads,
                           std::span<const Tensor> momentum_buffers,
                           std::span<const uint8_t> new_buffer, const SGDUpdate& update) {
  const KernelContext ctx(params[0]);
  std::vector<std::array<void*, 3>> addresses(params.size());
  std::vector<int64_t> numels(params.size());
  std::vector<SGDExtra> extras(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    addresses[i] = {params[i].data_ptr(), grads[i].data_ptr(),
                    momentum_buffers.empty() ? nullptr : momentum_buffers[i].data_ptr()};
    numels[i] = params[i].numel();
    extras[i] = {new_buffer.empty() ? 0 : static_cast<int32_t>(new_buffer[i])};
  }
  dispatch_floating(params[0].dtype(), "multi_tensor_sgd_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const SGDOp<T> op{SGDConsts<compute_t<T>>(update)};
    multi_tensor_apply<3, SGDExtra, kSGDMaxTensors>(
        ctx.stream, std::span<const std::array<void*, 3>>(addresses), numels,
        std::span<const SGDExtra>(extras), op);
  });
}

void cuda_multi_tensor_adam(std::span<const Tensor> params, std::span<const Tensor> grads,
                            std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                            std::span<const Tensor> max_exp_avg_sqs, std::span<const int64_t> steps,
                            const AdamUpdate& update) {
  const KernelContext ctx(params[0]);
  std::vector<std::array<void*, 5>> addresses(params.size());
  std::vector<int64_t> numels(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    addresses[i] = {params[i].data_ptr(), grads[i].data_ptr(), exp_avgs[i].data_ptr(),
                    exp_avg_sqs[i].data_ptr(),
                    max_exp_avg_sqs.empty() ? nullptr : max_exp_avg_sqs[i].data_ptr()};
    numels[i] = params[i].numel();
  }
  dispatch_floating(params[0].dtype(), "multi_tensor_adam_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = compute_t<T>;
    std::vector<AdamStepConsts<A>> extras(params.size());
    for (size_t i = 0; i < params.size(); ++i) extras[i] = adam_step_consts<A>(update, steps[i]);
    const AdamOp<T> op{AdamConsts<A>(update)};
    multi_tensor_apply<5, AdamStepConsts<A>, kAdamMaxTensors>(
        ctx.stream, std::span<const std::array<void*, 5>>(addresses), numels,
        std::span<const AdamStepConsts<A>>(extras), op);
  });
}

}  // namespace ember::detail

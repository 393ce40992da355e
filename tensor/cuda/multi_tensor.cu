// CUDA multi-tensor updates: SGD and Adam/AdamW over all tensors of a call in
// ceil(chunks / 320) launches of multi_tensor_apply, the element math shared with the CPU
// loop (detail/multi_tensor_math.h); the gradient norm's per-chunk partials and the scaling
// of clip_grad_norm_. The learning rate, the gradients' unscale factor, the skip flag and
// Adam's step counts may be read on the device (MultiTensorDeviceArgs), so the launches can
// be graph-captured and replayed with new values; the step-dependent scalars are then formed
// in the kernel (in double, as on the host).
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "../detail/dispatch.h"
#include "../detail/multi_tensor_math.h"
#include "../ops.h"
#include "block_sum.cuh"
#include "multi_tensor_apply.cuh"

EMBER_KERNELS_BEGIN
namespace {

constexpr int kSGDMaxTensors = 64;    // 3 lists
constexpr int kAdamMaxTensors = 36;   // 5 lists and a step (count, pointer) per tensor
constexpr int kStepMaxTensors = 110;  // 1 list of one-element step counts

// The device inputs as the kernels read them (null where the pass has none).
struct DeviceReads {
  const double* lr = nullptr;
  const float* inv_scale = nullptr;
  const float* found_inf = nullptr;

  explicit DeviceReads(const MultiTensorDeviceArgs& d)
      : lr(d.lr.defined() ? static_cast<const double*>(d.lr.data_ptr()) : nullptr),
        inv_scale(d.inv_scale.defined() ? static_cast<const float*>(d.inv_scale.data_ptr())
                                        : nullptr),
        found_inf(d.found_inf.defined() ? static_cast<const float*>(d.found_inf.data_ptr())
                                        : nullptr) {}
  __device__ bool skip() const { return found_inf != nullptr && *found_inf != 0.f; }
  __device__ double lr_or(double host_lr) const { return lr != nullptr ? *lr : host_lr; }
  // 1 without a scale: an exact product, so the unscaled pass is the plain one.
  template <typename A>
  __device__ A inv() const {
    return inv_scale != nullptr ? static_cast<A>(*inv_scale) : A(1);
  }
};

struct SGDExtra {
  int32_t fresh;  // the momentum buffer is new: it takes the gradient
};

template <typename T>
struct SGDOp {
  using A = acc_t<T>;
  SGDUpdate update;
  DeviceReads device;

  __device__ void operator()(const TensorListMeta<3, SGDExtra, kSGDMaxTensors>& meta, int tensor,
                             int64_t begin, int64_t end) const {
    if (device.skip()) return;
    const SGDConsts<A> c(update, device.lr_or(update.lr));
    const A inv = device.inv<A>();
    T* p = list_ptr<T>(meta, 0, tensor);
    const T* g = list_ptr<T>(meta, 1, tensor);
    T* b = list_ptr<T>(meta, 2, tensor);
    const bool fresh = meta.extra[tensor].fresh != 0;
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      A buffer = (c.has_momentum && !fresh) ? cast_to<A>(b[i]) : A(0);
      p[i] = cast_to<T>(sgd_element<A>(cast_to<A>(p[i]), cast_to<A>(g[i]) * inv, buffer, fresh, c));
      if (c.has_momentum) b[i] = cast_to<T>(buffer);
    }
  }
};

struct AdamExtra {
  int64_t step;              // the count after this update (host steps)
  const int64_t* on_device;  // or the count before it, on the device
};

template <typename T>
struct AdamOp {
  using A = acc_t<T>;
  AdamUpdate update;
  DeviceReads device;

  __device__ void operator()(const TensorListMeta<5, AdamExtra, kAdamMaxTensors>& meta, int tensor,
                             int64_t begin, int64_t end) const {
    if (device.skip()) return;
    const double lr = device.lr_or(update.lr);
    const AdamConsts<A> c(update, lr);
    const AdamExtra extra = meta.extra[tensor];
    const AdamStepConsts<A> s = adam_step_consts<A>(
        update, lr, extra.on_device != nullptr ? *extra.on_device + 1 : extra.step);
    const A inv = device.inv<A>();
    T* p = list_ptr<T>(meta, 0, tensor);
    const T* g = list_ptr<T>(meta, 1, tensor);
    T* m = list_ptr<T>(meta, 2, tensor);
    T* v = list_ptr<T>(meta, 3, tensor);
    T* v_max = list_ptr<T>(meta, 4, tensor);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      A mi = cast_to<A>(m[i]), vi = cast_to<A>(v[i]);
      A vmi = c.amsgrad ? cast_to<A>(v_max[i]) : A(0);
      p[i] =
          cast_to<T>(adam_element<A>(cast_to<A>(p[i]), cast_to<A>(g[i]) * inv, mi, vi, vmi, c, s));
      m[i] = cast_to<T>(mi);
      v[i] = cast_to<T>(vi);
      if (c.amsgrad) v_max[i] = cast_to<T>(vmi);
    }
  }
};

struct NormExtra {
  int64_t partial_base;  // where the tensor's chunks start in the partials
};

// Each block: the sum of |x|^p (max |x| for Inf) over its chunk, to partials[base + chunk].
template <typename T, bool Inf>
struct NormOp {
  using A = acc_t<T>;
  A* partials;
  A p;

  __device__ void operator()(const TensorListMeta<1, NormExtra, kSGDMaxTensors>& meta, int tensor,
                             int64_t begin, int64_t end) const {
    EMBER_SHARED(A, shared, [kMultiTensorBlockSize]);
    const T* x = list_ptr<T>(meta, 0, tensor);
    A acc = A(0);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
      if constexpr (Inf)
        acc = norm_max<A>(acc, cast_to<A>(x[i]));
      else
        acc += norm_term<A>(cast_to<A>(x[i]), p);
    }
    A total;
    if constexpr (Inf) {  // a fixed-order tree, as block_sum
      shared[threadIdx.x] = acc;
      __syncthreads();
      for (int half = kMultiTensorBlockSize / 2; half > 0; half >>= 1) {
        if (static_cast<int>(threadIdx.x) < half)
          shared[threadIdx.x] = norm_max<A>(shared[threadIdx.x], shared[threadIdx.x + half]);
        __syncthreads();
      }
      total = shared[0];
    } else {
      total = block_sum<kMultiTensorBlockSize>(acc, shared);
    }
    if (threadIdx.x == 0)
      partials[meta.extra[tensor].partial_base + begin / kMultiTensorChunk] = total;
  }
};

// Adds 1 to every step count unless found_inf is set (after the update read the old counts).
struct StepIncrementOp {
  DeviceReads device;

  __device__ void operator()(const TensorListMeta<1, NoExtra, kStepMaxTensors>& meta, int tensor,
                             int64_t /*begin*/, int64_t /*end*/) const {
    if (threadIdx.x == 0 && !device.skip()) ++*list_ptr<int64_t>(meta, 0, tensor);
  }
};

template <typename T>
struct MulOp {
  using A = acc_t<T>;
  const T* scale;

  __device__ void operator()(const TensorListMeta<1, NoExtra, kSGDMaxTensors>& meta, int tensor,
                             int64_t begin, int64_t end) const {
    T* x = list_ptr<T>(meta, 0, tensor);
    const A s = cast_to<A>(*scale);
    for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
      x[i] = cast_to<T>(cast_to<A>(x[i]) * s);
  }
};

Tensor multi_tensor_norm_partials_cuda(std::span<const Tensor> tensors, double p) {
  const KernelContext ctx(tensors[0]);
  std::vector<std::array<void*, 1>> addresses(tensors.size());
  std::vector<int64_t> numels(tensors.size());
  std::vector<NormExtra> extras(tensors.size());
  int64_t chunks = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    addresses[i] = {tensors[i].data_ptr()};
    numels[i] = tensors[i].numel();
    extras[i] = {chunks};
    chunks += (numels[i] + kMultiTensorChunk - 1) / kMultiTensorChunk;
  }
  const DType dtype = tensors[0].dtype() == kF64 ? kF64 : kF32;
  const Tensor partials =
      zeros({std::max<int64_t>(chunks, 1)}, TensorOptions(dtype, tensors[0].device()));
  dispatch_floating(tensors[0].dtype(), "multi_tensor_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    A* out = static_cast<A*>(partials.data_ptr());
    auto run = [&](auto op) {
      multi_tensor_apply<1, NormExtra, kSGDMaxTensors>(
          ctx.stream, std::span<const std::array<void*, 1>>(addresses), numels,
          std::span<const NormExtra>(extras), op);
    };
    if (std::isinf(p))
      run(NormOp<T, true>{out, A(0)});
    else
      run(NormOp<T, false>{out, static_cast<A>(p)});
  });
  return partials;
}

void multi_tensor_mul_cuda(std::span<const Tensor> tensors, const Tensor& scale) {
  const KernelContext ctx(tensors[0]);
  std::vector<std::array<void*, 1>> addresses(tensors.size());
  std::vector<int64_t> numels(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    addresses[i] = {tensors[i].data_ptr()};
    numels[i] = tensors[i].numel();
  }
  const std::vector<NoExtra> extras(tensors.size());
  dispatch_floating(tensors[0].dtype(), "multi_tensor_mul_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    multi_tensor_apply<1, NoExtra, kSGDMaxTensors>(
        ctx.stream, std::span<const std::array<void*, 1>>(addresses), numels,
        std::span<const NoExtra>(extras), MulOp<T>{static_cast<const T*>(scale.data_ptr())});
  });
}

void multi_tensor_sgd_cuda(std::span<const Tensor> params, std::span<const Tensor> grads,
                           std::span<const Tensor> momentum_buffers,
                           std::span<const uint8_t> new_buffer, const SGDUpdate& update,
                           const MultiTensorDeviceArgs& device) {
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
    const SGDOp<T> op{update, DeviceReads(device)};
    multi_tensor_apply<3, SGDExtra, kSGDMaxTensors>(
        ctx.stream, std::span<const std::array<void*, 3>>(addresses), numels,
        std::span<const SGDExtra>(extras), op);
  });
}

void multi_tensor_adam_cuda(std::span<const Tensor> params, std::span<const Tensor> grads,
                            std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                            std::span<const Tensor> max_exp_avg_sqs, std::span<const int64_t> steps,
                            const AdamUpdate& update, const MultiTensorDeviceArgs& device) {
  const KernelContext ctx(params[0]);
  std::vector<std::array<void*, 5>> addresses(params.size());
  std::vector<int64_t> numels(params.size());
  std::vector<AdamExtra> extras(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    addresses[i] = {params[i].data_ptr(), grads[i].data_ptr(), exp_avgs[i].data_ptr(),
                    exp_avg_sqs[i].data_ptr(),
                    max_exp_avg_sqs.empty() ? nullptr : max_exp_avg_sqs[i].data_ptr()};
    numels[i] = params[i].numel();
    extras[i] = device.steps.empty()
                    ? AdamExtra{steps[i], nullptr}
                    : AdamExtra{0, static_cast<const int64_t*>(device.steps[i].data_ptr())};
  }
  const DeviceReads reads(device);
  dispatch_floating(params[0].dtype(), "multi_tensor_adam_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    multi_tensor_apply<5, AdamExtra, kAdamMaxTensors>(
        ctx.stream, std::span<const std::array<void*, 5>>(addresses), numels,
        std::span<const AdamExtra>(extras), AdamOp<T>{update, reads});
  });
  if (device.steps.empty()) return;
  // The counts go up after the update has read them (a launch of its own: blocks of the
  // update may still be reading a count when another would have written it).
  std::vector<std::array<void*, 1>> counts(device.steps.size());
  for (size_t i = 0; i < counts.size(); ++i) counts[i] = {device.steps[i].data_ptr()};
  const std::vector<int64_t> ones(counts.size(), 1);
  const std::vector<NoExtra> none(counts.size());
  multi_tensor_apply<1, NoExtra, kStepMaxTensors>(
      ctx.stream, std::span<const std::array<void*, 1>>(counts), ones,
      std::span<const NoExtra>(none), StepIncrementOp{reads});
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(multi_tensor) {
  table.multi_tensor_sgd = multi_tensor_sgd_cuda;
  table.multi_tensor_adam = multi_tensor_adam_cuda;
  table.multi_tensor_norm_partials = multi_tensor_norm_partials_cuda;
  table.multi_tensor_mul = multi_tensor_mul_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

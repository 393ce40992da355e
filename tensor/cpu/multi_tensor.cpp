// CPU multi-tensor optimizer updates: all tensors of a call cut into chunks of at most
// kChunk elements, and one OpenMP loop over the chunks of all of them; each chunk is a plain
// loop over raw pointers that the compiler vectorises (f32/f64).
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "../detail/dispatch.h"
#include "../detail/multi_tensor_math.h"
#include "../ops.h"
#include "cpu_kernels.h"

namespace ember::detail {
namespace {

constexpr int64_t kChunk = 16384;

struct Chunk {
  size_t tensor;
  int64_t begin, end;
};

// The chunks of every tensor (by the parameters' sizes), in order, and their total length.
std::vector<Chunk> make_chunks(std::span<const Tensor> params, int64_t* total) {
  std::vector<Chunk> chunks;
  *total = 0;
  for (size_t t = 0; t < params.size(); ++t) {
    const int64_t n = params[t].numel();
    *total += n;
    for (int64_t begin = 0; begin < n; begin += kChunk)
      chunks.push_back({t, begin, std::min(begin + kChunk, n)});
  }
  return chunks;
}

// f(chunk) for every chunk (of `chunks`, or of the tensors' own), across OpenMP threads when
// there is enough work.
template <typename F>
void for_each_chunk(std::span<const Tensor> tensors, const F& f,
                    const std::vector<Chunk>& given = {}) {
  int64_t total = 0;
  std::vector<Chunk> own;
  if (given.empty())
    own = make_chunks(tensors, &total);
  else
    for (const Chunk& c : given) total += c.end - c.begin;
  const std::vector<Chunk>& chunks = given.empty() ? own : given;
  const auto count = static_cast<int64_t>(chunks.size());
#pragma omp parallel for schedule(static) if (total >= kParallelGrain && count > 1)
  for (int64_t c = 0; c < count; ++c) f(chunks[static_cast<size_t>(c)]);
}

template <typename T>
T* ptr(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// The device inputs, read where they lie (CPU memory): whether found_inf stops the pass, the
// learning rate, and the factor each gradient is multiplied by as it is read (1 when none: an
// exact product, so the unscaled pass is the plain one bit for bit).
struct DeviceValues {
  bool skip;
  double lr;
  float inv_scale;

  DeviceValues(const MultiTensorDeviceArgs& d, double host_lr)
      : skip(d.found_inf.defined() && *static_cast<const float*>(d.found_inf.data_ptr()) != 0.f),
        lr(d.lr.defined() ? *static_cast<const double*>(d.lr.data_ptr()) : host_lr),
        inv_scale(d.inv_scale.defined() ? *static_cast<const float*>(d.inv_scale.data_ptr())
                                        : 1.f) {}
};

// f(std::bool_constant<b>{}): a runtime flag as a compile-time one, so the loops below have no
// branches left for the vectoriser to give up on.
template <typename F>
void with_flag(bool b, const F& f) {
  if (b)
    f(std::true_type{});
  else
    f(std::false_type{});
}

template <typename T>
void sgd_typed(std::span<const Tensor> params, std::span<const Tensor> grads,
               std::span<const Tensor> buffers, std::span<const uint8_t> fresh,
               const SGDUpdate& update, const MultiTensorDeviceArgs& device) {
  using A = acc_t<T>;
  const DeviceValues values(device, update.lr);
  if (values.skip) return;
  const SGDConsts<A> consts(update, values.lr);
  const auto inv = static_cast<A>(values.inv_scale);
  for_each_chunk(params, [&](const Chunk& chunk) {
    T* __restrict p = ptr<T>(params[chunk.tensor]) + chunk.begin;
    const T* __restrict g = ptr<const T>(grads[chunk.tensor]) + chunk.begin;
    T* __restrict b = consts.has_momentum ? ptr<T>(buffers[chunk.tensor]) + chunk.begin : nullptr;
    const bool is_new = consts.has_momentum && fresh[chunk.tensor] != 0;
    const int64_t n = chunk.end - chunk.begin;
    with_flag(consts.has_momentum, [&](auto momentum) {
      with_flag(is_new, [&](auto new_buffer) {
        with_flag(consts.nesterov, [&](auto nesterov) {
          with_flag(consts.has_weight_decay, [&](auto weight_decay) {
            SGDConsts<A> c = consts;
            c.has_momentum = momentum;
            c.nesterov = nesterov;
            c.has_weight_decay = weight_decay;
            for (int64_t i = 0; i < n; ++i) {
              A buffer = (momentum && !new_buffer) ? static_cast<A>(b[i]) : A(0);
              p[i] = static_cast<T>(sgd_element<A>(static_cast<A>(p[i]), static_cast<A>(g[i]) * inv,
                                                   buffer, new_buffer, c));
              if constexpr (momentum) b[i] = static_cast<T>(buffer);
            }
          });
        });
      });
    });
  });
}

template <typename T>
void adam_typed(std::span<const Tensor> params, std::span<const Tensor> grads,
                std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                std::span<const Tensor> max_exp_avg_sqs, std::span<const int64_t> steps,
                const AdamUpdate& update, const MultiTensorDeviceArgs& device) {
  using A = acc_t<T>;
  const DeviceValues values(device, update.lr);
  if (values.skip) return;
  const AdamConsts<A> c(update, values.lr);
  const auto inv = static_cast<A>(values.inv_scale);
  std::vector<AdamStepConsts<A>> per_tensor(params.size());
  for (size_t t = 0; t < params.size(); ++t) {
    const int64_t step =
        device.steps.empty() ? steps[t] : *static_cast<int64_t*>(device.steps[t].data_ptr()) + 1;
    per_tensor[t] = adam_step_consts<A>(update, values.lr, step);
  }
  for_each_chunk(params, [&](const Chunk& chunk) {
    const size_t t = chunk.tensor;
    T* __restrict p = ptr<T>(params[t]) + chunk.begin;
    const T* __restrict g = ptr<const T>(grads[t]) + chunk.begin;
    T* __restrict m = ptr<T>(exp_avgs[t]) + chunk.begin;
    T* __restrict v = ptr<T>(exp_avg_sqs[t]) + chunk.begin;
    T* __restrict v_max = c.amsgrad ? ptr<T>(max_exp_avg_sqs[t]) + chunk.begin : nullptr;
    const AdamStepConsts<A> s = per_tensor[t];
    const int64_t n = chunk.end - chunk.begin;
    with_flag(c.amsgrad, [&](auto amsgrad) {
      with_flag(c.has_weight_decay, [&](auto weight_decay) {
        with_flag(c.decoupled, [&](auto decoupled) {
          AdamConsts<A> local = c;
          local.amsgrad = amsgrad;
          local.has_weight_decay = weight_decay;
          local.decoupled = decoupled;
          for (int64_t i = 0; i < n; ++i) {
            A mi = static_cast<A>(m[i]), vi = static_cast<A>(v[i]);
            A vmi = amsgrad ? static_cast<A>(v_max[i]) : A(0);
            p[i] = static_cast<T>(adam_element<A>(static_cast<A>(p[i]), static_cast<A>(g[i]) * inv,
                                                  mi, vi, vmi, local, s));
            m[i] = static_cast<T>(mi);
            v[i] = static_cast<T>(vi);
            if constexpr (amsgrad) v_max[i] = static_cast<T>(vmi);
          }
        });
      });
    });
  });
  for (const Tensor& step : device.steps) ++*static_cast<int64_t*>(step.data_ptr());
}

Tensor multi_tensor_norm_partials_cpu(std::span<const Tensor> tensors, double p) {
  int64_t total = 0;
  const std::vector<Chunk> chunks = make_chunks(tensors, &total);
  std::vector<double> partials(chunks.size(), 0.0);
  const bool inf = std::isinf(p);
  dispatch_floating(tensors[0].dtype(), "multi_tensor_norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    for_each_chunk(
        tensors,
        [&](const Chunk& chunk) {
          const T* __restrict x = ptr<const T>(tensors[chunk.tensor]) + chunk.begin;
          const int64_t n = chunk.end - chunk.begin;
          double acc = 0.0;
          // Eight running sums (a fixed order, so deterministic) that the compiler vectorises.
          auto sum = [&](auto term) {
            double lanes[8] = {};
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
              for (int j = 0; j < 8; ++j) lanes[j] += term(static_cast<double>(x[i + j]));
            for (; i < n; ++i) lanes[0] += term(static_cast<double>(x[i]));
            for (const double lane : lanes) acc += lane;
          };
          if (inf) {
            for (int64_t i = 0; i < n; ++i) acc = norm_max<double>(acc, static_cast<double>(x[i]));
          } else if (p == 2.0) {
            sum([](double v) { return v * v; });
          } else if (p == 1.0) {
            sum([](double v) { return std::abs(v); });
          } else {
            sum([p](double v) { return norm_term<double>(v, p); });
          }
          // Chunks come in the order make_chunks gave them: find this one's slot.
          partials[static_cast<size_t>(&chunk - chunks.data())] = acc;
        },
        chunks);
  });
  double result = 0.0;
  for (const double v : partials) result = inf ? norm_max<double>(result, v) : result + v;
  return full({1}, result, kF64);
}

void multi_tensor_mul_cpu(std::span<const Tensor> tensors, const Tensor& scale) {
  dispatch_floating(tensors[0].dtype(), "multi_tensor_mul_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using A = acc_t<T>;
    const A s = static_cast<A>(*static_cast<const T*>(scale.data_ptr()));
    for_each_chunk(tensors, [&](const Chunk& chunk) {
      T* __restrict x = ptr<T>(tensors[chunk.tensor]) + chunk.begin;
      const int64_t n = chunk.end - chunk.begin;
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<T>(static_cast<A>(x[i]) * s);
    });
  });
}

void multi_tensor_sgd_cpu(std::span<const Tensor> params, std::span<const Tensor> grads,
                          std::span<const Tensor> momentum_buffers,
                          std::span<const uint8_t> new_buffer, const SGDUpdate& update,
                          const MultiTensorDeviceArgs& device) {
  dispatch_floating(params[0].dtype(), "multi_tensor_sgd_", [&](auto tag) {
    sgd_typed<typename decltype(tag)::type>(params, grads, momentum_buffers, new_buffer, update,
                                            device);
  });
}

void multi_tensor_adam_cpu(std::span<const Tensor> params, std::span<const Tensor> grads,
                           std::span<const Tensor> exp_avgs, std::span<const Tensor> exp_avg_sqs,
                           std::span<const Tensor> max_exp_avg_sqs, std::span<const int64_t> steps,
                           const AdamUpdate& update, const MultiTensorDeviceArgs& device) {
  dispatch_floating(params[0].dtype(), "multi_tensor_adam_", [&](auto tag) {
    adam_typed<typename decltype(tag)::type>(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                             steps, update, device);
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(multi_tensor) {
  table.multi_tensor_sgd = multi_tensor_sgd_cpu;
  table.multi_tensor_adam = multi_tensor_adam_cpu;
  table.multi_tensor_norm_partials = multi_tensor_norm_partials_cpu;
  table.multi_tensor_mul = multi_tensor_mul_cpu;
}

}  // namespace ember::detail

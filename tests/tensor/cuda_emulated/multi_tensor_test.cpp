// tensor/cuda/multi_tensor.cu and multi_tensor_apply.cuh (SGD and Adam over lists of
// tensors, the norm's per-chunk partials, the scale multiply) emulated on the CPU
// (tensor/cuda/emulated/emulate.h) against the CPU backends: lists with empty tensors,
// tensors longer than one chunk (65536), every floating dtype, momentum and nesterov,
// weight decay, AdamW and amsgrad, device steps, learning rate and found_inf; planted bugs
// fail.
#include <ember/tensor/cuda/multi_tensor.cu>

#include "emulated_test_util.h"

namespace ember::testing {
namespace {

std::vector<Tensor> list(DType dtype, uint64_t seed) {
  return {random_input({65600}, dtype, seed), random_input({0}, dtype, seed + 1),
          random_input({3, 7}, dtype, seed + 2), random_input({1}, dtype, seed + 3)};
}

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(t.clone());
  return out;
}

// The multi-tensor entries of the emulated CUDA table, or of the CPU's.
const KernelTable& kernels(bool emulated) {
  return emulated ? emulated_table<detail::emulated::register_cuda_multi_tensor_kernels>()
                  : cpu_table();
}

// The CPU's norm total (its one partial).
double cpu_norm_total(std::span<const Tensor> ts, double p) {
  return cpu_table().multi_tensor_norm_partials(ts, p).item<double>();
}

// The same backend call on copies of the same lists: CPU, then emulated in both orders.
void expect_same(const std::function<Outputs(bool emulated)>& run, double tol) {
  const Outputs want = run(false);
  for (const Outputs& got : in_both_orders([&] { return run(true); })) {
    for (size_t i = 0; i < got.size(); ++i) {
      const auto m = mismatch(got[i], want[i], tol, tol);
      EXPECT_FALSE(m.has_value()) << "output " << i << ": " << *m;
    }
  }
}

std::function<Outputs(bool)> sgd_run(DType dtype, const SGDUpdate& u, bool device_args) {
  return [=](bool emulated) {
    const auto sgd = kernels(emulated).multi_tensor_sgd;
    std::vector<Tensor> params = list(dtype, 1), grads = list(dtype, 10), buffers = list(dtype, 20);
    const std::vector<uint8_t> fresh = {1, 0, 0, 1};
    MultiTensorDeviceArgs d;
    if (device_args) {
      d.lr = full({}, 0.05, kF64);
      d.inv_scale = full({1}, 0.5, kF32);
      d.found_inf = zeros({1}, kF32);
    }
    const bool momentum = u.momentum != 0.0;
    sgd(params, grads, momentum ? std::span<const Tensor>(buffers) : std::span<const Tensor>(),
        momentum ? std::span<const uint8_t>(fresh) : std::span<const uint8_t>(), u, d);
    Outputs out = params;
    if (momentum) out.insert(out.end(), buffers.begin(), buffers.end());
    return out;
  };
}

TEST(EmulatedMultiTensor, SgdMatchesCpu) {
  for (DType dtype : {kF32, kF64, kBF16, kF16}) {
    for (bool momentum : {false, true}) {
      for (bool device_args : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype << (momentum ? " momentum" : "")
                                          << (device_args ? " device args" : ""));
        SGDUpdate u;
        u.lr = 0.1;
        u.weight_decay = 0.01;
        if (momentum) {
          u.momentum = 0.9;
          u.dampening = 0.1;
          u.nesterov = true;
        }
        expect_same(sgd_run(dtype, u, device_args), tolerance(dtype));
      }
    }
  }
}

std::function<Outputs(bool)> adam_run(DType dtype, const AdamUpdate& u, bool device_steps) {
  return [=](bool emulated) {
    const auto adam = kernels(emulated).multi_tensor_adam;
    std::vector<Tensor> params = list(dtype, 1), grads = list(dtype, 10), m = list(dtype, 20),
                        v = list(dtype, 30), vmax = list(dtype, 40);
    for (Tensor& t : v) t.abs_();
    for (Tensor& t : vmax) t.abs_();
    const std::vector<int64_t> host_steps = {3, 1, 2, 5};
    std::vector<Tensor> steps;
    for (int64_t s : host_steps) steps.push_back(full({}, s - 1, kI64));
    MultiTensorDeviceArgs d;
    if (device_steps) {
      d.steps = steps;
      d.found_inf = zeros({1}, kF32);
    }
    adam(params, grads, m, v, u.amsgrad ? std::span<const Tensor>(vmax) : std::span<const Tensor>(),
         device_steps ? std::span<const int64_t>() : std::span<const int64_t>(host_steps), u, d);
    Outputs out = params;
    out.insert(out.end(), m.begin(), m.end());
    out.insert(out.end(), v.begin(), v.end());
    if (u.amsgrad) out.insert(out.end(), vmax.begin(), vmax.end());
    if (device_steps) out.insert(out.end(), steps.begin(), steps.end());
    return out;
  };
}

TEST(EmulatedMultiTensor, AdamMatchesCpu) {
  for (DType dtype : {kF32, kF64, kBF16}) {
    for (bool adamw : {false, true}) {
      for (bool device_steps : {false, true}) {
        SCOPED_TRACE(::testing::Message() << dtype << (adamw ? " adamw amsgrad" : "")
                                          << (device_steps ? " device steps" : ""));
        AdamUpdate u;
        u.lr = 0.01;
        u.weight_decay = 0.1;
        u.decoupled_weight_decay = adamw;
        u.amsgrad = adamw;
        expect_same(adam_run(dtype, u, device_steps), tolerance(dtype));
      }
    }
  }
}

TEST(EmulatedMultiTensor, NormPartialsAndMulMatchCpu) {
  for (DType dtype : {kF32, kF64, kBF16}) {
    for (double p : {1.0, 2.0, 3.0, double{INFINITY}}) {
      SCOPED_TRACE(::testing::Message() << dtype << " p " << p);
      const std::vector<Tensor> ts = list(dtype, 50);
      const Tensor partials = kernels(true).multi_tensor_norm_partials(ts, p);
      const double got =
          std::isinf(p) ? max(partials).item<double>() : sum(partials).item<double>();
      const double want = cpu_norm_total(ts, p);
      EXPECT_NEAR(got, want, 1e-4 * std::abs(want));
    }
    const Tensor scale = full({1}, 0.75, dtype);
    expect_same(
        [&](bool emulated) {
          std::vector<Tensor> ts = clones(list(dtype, 60));
          kernels(emulated).multi_tensor_mul(ts, scale);
          return ts;
        },
        0.0);
  }
}

TEST(EmulatedMultiTensor, PlantedBugsFail) {
  // The infinity norm's fixed-order tree without its first barrier.
  const std::vector<Tensor> ts = {random_input({600}, kF32, 70)};
  const double want = cpu_norm_total(ts, INFINITY);
  const cuda_emu::PlantedBug bug(cuda_emu::Bug::kMissingBarrier, 0);
  bool failed = false;
  for (const Outputs& got : in_both_orders(
           [&] { return Outputs{kernels(true).multi_tensor_norm_partials(ts, INFINITY)}; })) {
    failed = failed || !(max(got[0]).item<double>() == want);
  }
  EXPECT_GT(bug.hits(), 0);
  EXPECT_TRUE(failed);
}

}  // namespace
}  // namespace ember::testing

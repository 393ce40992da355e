// The loss-scaling ops: the fused inf/NaN check + unscale, and the scale update.
#include <array>
#include <limits>

#include <ember/tensor/ops_amp.h>

#include "test_util.h"

namespace ember {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void check_unscale(Device device) {
  SCOPED_TRACE(device.str());
  // Mixed dtypes, a non-contiguous tensor and an empty one, all in one call.
  Tensor a = from_vector(std::vector<float>{2.f, -4.f, 8.f}).to(device);
  Tensor b = from_vector(std::vector<double>{6.0, 0.5}).to(device);
  Tensor c = from_vector(std::vector<float>{4.f, 12.f}).to(device).to(kBF16);
  Tensor d_base = from_vector(std::vector<float>{1.f, 2.f, 3.f, 4.f}, {2, 2}).to(device);
  Tensor d = d_base.t();  // strided: written back through the view
  Tensor e = empty({0}, TensorOptions(kF32, device));
  const Tensor found = zeros({1}, TensorOptions(kF32, device));
  const Tensor inv = full({1}, 0.5, TensorOptions(kF32, device));
  amp_foreach_non_finite_check_and_unscale_({a, b, c, d, e}, found, inv);
  EXPECT_EQ(found.item<float>(), 0.f);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.f, -2.f, 4.f}));
  EXPECT_EQ(b.to_vector<double>(), (std::vector<double>{3.0, 0.25}));
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{2.f, 6.f}));
  EXPECT_EQ(d_base.to_vector<float>(), (std::vector<float>{0.5f, 1.f, 1.5f, 2.f}));

  // One bad element anywhere sets the flag; the others are still unscaled.
  Tensor big = ones({100000}, TensorOptions(kF32, device));
  big.narrow(0, 77777, 1).fill_(kNaN);
  amp_foreach_non_finite_check_and_unscale_({a, big}, found, inv);
  EXPECT_EQ(found.item<float>(), 1.f);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{0.5f, -1.f, 2.f}));
  EXPECT_EQ(big.narrow(0, 99999, 1).item<float>(), 0.5f);
  // The flag is only ever set: a clean pass leaves it at 1.
  amp_foreach_non_finite_check_and_unscale_({a}, found, inv);
  EXPECT_EQ(found.item<float>(), 1.f);

  // inv_scale 1 leaves every bit, inf included.
  Tensor f = from_vector(std::vector<float>{kInf, 3.f}).to(device);
  const Tensor found2 = zeros({1}, TensorOptions(kF32, device));
  amp_foreach_non_finite_check_and_unscale_({f}, found2, ones({1}, TensorOptions(kF32, device)));
  EXPECT_EQ(found2.item<float>(), 1.f);
  EXPECT_EQ(f.to_vector<float>(), (std::vector<float>{kInf, 3.f}));
}

TEST(AmpOps, NonFiniteCheckAndUnscaleOnCpu) { check_unscale(kCPU); }

TEST(AmpOps, NonFiniteCheckAndUnscaleOnCuda) {
  if (!cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_unscale(cuda_device());
  // Many tensors of many sizes in one launch agree with the CPU.
  std::vector<Tensor> cpu, gpu;
  for (int i = 0; i < 300; ++i) {
    Tensor t = randn({1 + (i * 977) % 40000});
    if (i == 123) t.narrow(0, t.numel() - 1, 1).fill_(-kInf);
    cpu.push_back(t.clone());
    gpu.push_back(t.to(cuda_device()).to(i % 3 == 0 ? kF16 : kF32));
    if (i % 3 == 0) cpu.back() = cpu.back().to(kF16);
  }
  const Tensor fc = zeros({1}), fg = zeros({1}, TensorOptions(kF32, cuda_device()));
  amp_foreach_non_finite_check_and_unscale_(cpu, fc, full({1}, 0.125));
  amp_foreach_non_finite_check_and_unscale_(gpu, fg,
                                            full({1}, 0.125, TensorOptions(kF32, cuda_device())));
  EXPECT_EQ(fg.item<float>(), 1.f);
  for (size_t i = 0; i < cpu.size(); ++i) testing::expect_close(gpu[i].cpu(), cpu[i], 0, 0);

  // A clean pass over every dtype, tensors spanning several chunks, and more tensors than a
  // launch holds leaves found_inf at 0 and scales every element exactly as the CPU does.
  std::vector<Tensor> cpu2, gpu2;
  for (int i = 0; i < 260; ++i) {
    const DType dtype = std::array{kF32, kF16, kBF16, kF64}[static_cast<size_t>(i % 4)];
    Tensor t = randn({i % 50 == 0 ? 200000 : 1 + (i * 131) % 3000}).to(dtype);
    cpu2.push_back(t.clone());
    gpu2.push_back(t.to(cuda_device()));
  }
  const Tensor fc2 = zeros({1}), fg2 = zeros({1}, TensorOptions(kF32, cuda_device()));
  amp_foreach_non_finite_check_and_unscale_(cpu2, fc2, full({1}, 0.25));
  amp_foreach_non_finite_check_and_unscale_(gpu2, fg2,
                                            full({1}, 0.25, TensorOptions(kF32, cuda_device())));
  EXPECT_EQ(fg2.item<float>(), 0.f);
  for (size_t i = 0; i < cpu2.size(); ++i) testing::expect_close(gpu2[i].cpu(), cpu2[i], 0, 0);
}

TEST(AmpOps, UpdateScaleBacksOffAndGrows) {
  const Tensor scale = full({1}, 1024.0), tracker = zeros({1}, kI32);
  const Tensor clean = zeros({1}), bad = ones({1});
  // The new scale after each update (decided where the tensors lie, read back here).
  auto update = [&](const Tensor& found) {
    amp_update_scale_(scale, tracker, found, 2.0, 0.5, 3);
    return scale.item<float>();
  };
  EXPECT_EQ(update(clean), 1024.f);
  EXPECT_EQ(tracker.item<int>(), 1);
  EXPECT_EQ(update(clean), 1024.f);
  EXPECT_EQ(update(clean), 2048.f);
  EXPECT_EQ(tracker.item<int>(), 0);
  EXPECT_EQ(update(clean), 2048.f);
  EXPECT_EQ(update(bad), 1024.f);
  EXPECT_EQ(tracker.item<int>(), 0);
  // A grown scale that would overflow f32 is not kept.
  const Tensor huge = full({1}, 3e38);
  amp_update_scale_(huge, tracker, clean, 2.0, 0.5, 1);
  EXPECT_EQ(huge.item<float>(), 3e38f);
}

// On a GPU the update runs in a kernel and agrees with the CPU's, growth, backoff and the
// overflow guard included.
TEST(AmpOps, UpdateScaleOnCudaMatchesCpu) {
  EMBER_REQUIRE_CUDA();
  const TensorOptions on_gpu(kF32, cuda_device());
  const Tensor scale = full({1}, 1024.0, on_gpu),
               tracker = zeros({1}, TensorOptions(kI32, cuda_device()));
  const Tensor cpu_scale = full({1}, 1024.0), cpu_tracker = zeros({1}, kI32);
  for (const float found : {0.f, 0.f, 0.f, 1.f, 0.f, 0.f, 0.f}) {
    amp_update_scale_(scale, tracker, full({1}, found, on_gpu), 2.0, 0.5, 3);
    amp_update_scale_(cpu_scale, cpu_tracker, full({1}, found), 2.0, 0.5, 3);
    EXPECT_EQ(scale.item<float>(), cpu_scale.item<float>());
    EXPECT_EQ(tracker.item<int>(), cpu_tracker.item<int>());
  }
}

TEST(AmpOps, BadArgumentsAreNamed) {
  Tensor g = ones({2});
  EXPECT_EMBER_ERROR(amp_foreach_non_finite_check_and_unscale_({g}, zeros({2}), ones({1})),
                     "found_inf must be a 1-element f32 tensor, got f32 with 2 elements");
  EXPECT_EMBER_ERROR(amp_foreach_non_finite_check_and_unscale_({g}, zeros({1}), ones({1}, kF64)),
                     "inv_scale must be a 1-element f32 tensor, got f64");
  EXPECT_EMBER_ERROR(
      amp_foreach_non_finite_check_and_unscale_({ones({2}, kI64)}, zeros({1}), ones({1})),
      "tensor 0 has dtype i64");
  EXPECT_EMBER_ERROR(amp_update_scale_(ones({1}), zeros({1}), zeros({1}), 2.0, 0.5, 10),
                     "growth_tracker must be a 1-element i32 tensor");
  EXPECT_EMBER_ERROR(amp_update_scale_(ones({1}), zeros({1}, kI32), zeros({1}), 2.0, 0.5, 0),
                     "growth_interval must be positive, got 0");
}

}  // namespace
}  // namespace ember

// The TF32 policy: PyTorch's defaults, the switches, and (on a GPU) what they change.
#include <ember/tensor/precision.h>

#include "test_util.h"

namespace ember {
namespace {

TEST(Precision, DefaultsArePyTorchs) {
  // torch: get_float32_matmul_precision() == "highest", backends.cudnn.allow_tf32 == True.
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
  EXPECT_FALSE(matmul_allow_tf32());
  EXPECT_TRUE(cudnn_allow_tf32());
}

TEST(Precision, SettersAndGetters) {
  for (const char* p : {"high", "medium", "highest"}) {
    set_float32_matmul_precision(p);
    EXPECT_EQ(get_float32_matmul_precision(), p);
    EXPECT_EQ(matmul_allow_tf32(), std::string(p) != "highest");
  }
  set_cudnn_allow_tf32(false);
  EXPECT_FALSE(cudnn_allow_tf32());
  set_cudnn_allow_tf32(true);
  EXPECT_TRUE(cudnn_allow_tf32());
}

TEST(Precision, UnknownPrecisionIsRefusedAndChangesNothing) {
  set_float32_matmul_precision("high");
  EXPECT_EMBER_ERROR(set_float32_matmul_precision("tf32"), "unknown precision \"tf32\"");
  EXPECT_EMBER_ERROR(set_float32_matmul_precision("Highest"), "\"Highest\"");
  EXPECT_EQ(get_float32_matmul_precision(), "high");
  set_float32_matmul_precision("highest");
}

TEST(Precision, GuardRestoresBothSwitches) {
  {
    Float32PrecisionGuard tf32("high", false);
    EXPECT_EQ(get_float32_matmul_precision(), "high");
    EXPECT_FALSE(cudnn_allow_tf32());
    EXPECT_EMBER_ERROR(Float32PrecisionGuard("fast", true), "\"fast\"");
    EXPECT_EQ(get_float32_matmul_precision(), "high");
  }
  EXPECT_EQ(get_float32_matmul_precision(), "highest");
  EXPECT_TRUE(cudnn_allow_tf32());
}

// Largest relative difference of a from b, over max |b|.
double rel_diff(const Tensor& a, const Tensor& b) {
  return max(abs(sub(a.cpu(), b.cpu()))).item<double>() / max(abs(b.cpu())).item<double>();
}

// On a TF32-capable GPU (compute capability >= 8.0): "highest" matches the CPU to f32
// rounding; "high" differs by TF32's rounding (about 2^-11 per product), but not by more.
TEST(Precision, Tf32OnAndOffOnTheGpu) {
  EMBER_REQUIRE_CUDA();
  const Tensor a = randn({256, 512}), b = randn({512, 256});
  const Tensor ref = matmul(a.to(kF64), b.to(kF64)).to(kF32);
  const Tensor ga = a.cuda(), gb = b.cuda();
  {
    Float32PrecisionGuard exact("highest", false);
    EXPECT_LT(rel_diff(matmul(ga, gb), ref), 1e-5);
  }
  {
    Float32PrecisionGuard tf32("high", true);
    const double d = rel_diff(matmul(ga, gb), ref);
    EXPECT_LT(d, 5e-3);
    if (cuda::device_capability(0).first >= 8) {
      EXPECT_GT(d, 1e-5) << "TF32 did not engage";
    }
  }
  const Tensor x = randn({8, 64, 16, 16}), w = randn({64, 64, 3, 3});
  const Tensor cref = conv2d(x.to(kF64), w.to(kF64), {}, {1, 1}, {1, 1}).to(kF32);
  {
    Float32PrecisionGuard exact("highest", false);
    EXPECT_LT(rel_diff(conv2d(x.cuda(), w.cuda(), {}, {1, 1}, {1, 1}), cref), 1e-5);
  }
  {
    Float32PrecisionGuard tf32("highest", true);
    EXPECT_LT(rel_diff(conv2d(x.cuda(), w.cuda(), {}, {1, 1}, {1, 1}), cref), 5e-3);
  }
}

}  // namespace
}  // namespace ember

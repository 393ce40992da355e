// The tensor-core attention kernel (tensor/cuda/attention_tc.cuh) on the GPU against the CPU op
// (skipped where no GPU is visible; the same kernels run emulated on every machine in
// tests/tensor/cuda_emulated/attention_tc_test.cpp): the real kernels through the op, forward
// and the three gradients, bf16 and f16, L in {1, 17, 64, 65, 127, 128, 200, 1024}, D 64 and
// 128, causal or not, Lq != Lk, dropout; every variant at small shapes (for
// compute-sanitizer); the simple kernel beside it (EMBER_SDPA_CUDA_KERNEL); bitwise-repeatable
// gradients.
// Tolerances: attention_tc_util.h.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>

#include "attention_tc_util.h"
#include "test_util.h"

namespace ember::testing::attention_tc {
namespace {

void expect_near(const Tensor& got, const Tensor& want, double f, const char* what) {
  SCOPED_TRACE(what);
  const Tensor g = got.to(kCPU).to(kF32), w = want.to(kCPU).to(kF32);
  testing::expect_close(g, w, f, f * magnitude(w));
}

void expect_near(const Grads& got, const Grads& want, double f) {
  expect_near(got.out, want.out, f, "output");
  expect_near(got.q, want.q, f, "grad q");
  expect_near(got.k, want.k, f, "grad k");
  expect_near(got.v, want.v, f, "grad v");
}

// ---------------------------------------------------------------------------------------
// CUDA.

// Sets EMBER_SDPA_CUDA_KERNEL for a scope (unset: null) and restores it.
class KernelChoice {
 public:
  explicit KernelChoice(const char* value) {
    if (const char* old = std::getenv(kName)) saved_ = old;
    if (value != nullptr) {
      setenv(kName, value, 1);
    } else {
      unsetenv(kName);
    }
  }
  ~KernelChoice() {
    if (saved_) {
      setenv(kName, saved_->c_str(), 1);
    } else {
      unsetenv(kName);
    }
  }
  KernelChoice(const KernelChoice&) = delete;
  KernelChoice& operator=(const KernelChoice&) = delete;

 private:
  static constexpr const char* kName = "EMBER_SDPA_CUDA_KERNEL";
  std::optional<std::string> saved_;
};

Grads on_cuda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, bool causal,
              double dropout = 0.0, uint64_t seed = 0) {
  const Device dev = cuda_device();
  return through_op(q.to(dev), k.to(dev), v.to(dev), g.to(dev), causal, dropout, seed);
}

TEST(AttentionTensorCore, CudaMatchesCpuOp) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  uint64_t seed = 1000;
  for (DType dtype : {kBF16, kF16}) {
    for (int64_t length : {1, 17, 64, 65, 127, 128, 200, 1024}) {
      for (int64_t dim : {64, 128}) {
        for (bool causal : {false, true}) {
          SCOPED_TRACE(::testing::Message()
                       << dtype << " L " << length << " D " << dim << (causal ? " causal" : ""));
          const Shape shape = {2, 3, length, dim};
          const Tensor q = input(shape, seed, dtype), k = input(shape, seed + 1, dtype),
                       v = input(shape, seed + 2, dtype), g = input(shape, seed + 3, dtype);
          seed += 4;
          expect_near(on_cuda(q, k, v, g, causal), through_op(q, k, v, g, causal),
                      tolerance(dtype));
        }
      }
    }
  }
}

TEST(AttentionTensorCore, CudaOtherLengthsAndDropoutMatchCpuOp) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  struct Case {
    int64_t lq, lk, dim;
    bool causal;
    double dropout;
  };
  const Case cases[] = {
      {70, 33, 64, true, 0.0},     {33, 70, 128, false, 0.0}, {20, 300, 64, true, 0.0},
      {300, 20, 128, true, 0.0},   {200, 200, 64, true, 0.1}, {129, 129, 128, false, 0.3},
      {1024, 1024, 64, true, 0.1},
  };
  uint64_t seed = 2000;
  for (DType dtype : {kBF16, kF16}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << dtype << " Lq " << c.lq << " Lk " << c.lk << " D " << c.dim
                   << (c.causal ? " causal" : "") << " dropout " << c.dropout);
      const Tensor q = input({2, 2, c.lq, c.dim}, seed, dtype),
                   k = input({2, 2, c.lk, c.dim}, seed + 1, dtype),
                   v = input({2, 2, c.lk, c.dim}, seed + 2, dtype),
                   g = input({2, 2, c.lq, c.dim}, seed + 3, dtype);
      seed += 4;
      expect_near(on_cuda(q, k, v, g, c.causal, c.dropout, seed),
                  through_op(q, k, v, g, c.causal, c.dropout, seed), tolerance(dtype));
    }
  }
}

// Every kernel variant (D 64 and 128, causal or not, dropout or not) at small shapes with
// tails, quick enough to run under compute-sanitizer (bench/attention_gpu_check.sh).
TEST(AttentionTensorCore, CudaSmallShapesEveryVariant) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  uint64_t seed = 2500;
  for (int64_t dim : {64, 128}) {
    for (bool causal : {false, true}) {
      for (double dropout : {0.0, 0.2}) {
        SCOPED_TRACE(::testing::Message()
                     << "D " << dim << (causal ? " causal" : "") << " dropout " << dropout);
        const Tensor q = input({1, 2, 130, dim}, seed, kBF16),
                     k = input({1, 2, 97, dim}, seed + 1, kBF16),
                     v = input({1, 2, 97, dim}, seed + 2, kBF16),
                     g = input({1, 2, 130, dim}, seed + 3, kBF16);
        seed += 4;
        expect_near(on_cuda(q, k, v, g, causal, dropout, seed),
                    through_op(q, k, v, g, causal, dropout, seed), tolerance(kBF16));
      }
    }
  }
}

TEST(AttentionTensorCore, SimpleAndTensorCoreKernelsAgreeAndBothRun) {
  EMBER_REQUIRE_CUDA();
  const Shape shape = {2, 3, 200, 64};
  const Tensor q = input(shape, 3000, kBF16), k = input(shape, 3001, kBF16),
               v = input(shape, 3002, kBF16), g = input(shape, 3003, kBF16);
  std::optional<Grads> simple, tensor_core, by_default;
  {
    const KernelChoice choice("simple");
    simple = on_cuda(q, k, v, g, true);
  }
  {
    const KernelChoice choice("tensor_core");
    tensor_core = on_cuda(q, k, v, g, true);
  }
  {
    const KernelChoice choice(nullptr);
    by_default = on_cuda(q, k, v, g, true);
  }
  expect_near(*tensor_core, *simple, tolerance(kBF16));
  // The simple kernel keeps the weights in f32, the tensor-core one rounds them to bf16:
  // different bits show that the variable switched kernels; unset picks the tensor cores.
  EXPECT_FALSE(equal(tensor_core->q, simple->q));
  EXPECT_TRUE(equal(by_default->q, tensor_core->q));
  {
    const KernelChoice choice("fastest");
    EXPECT_EMBER_ERROR(on_cuda(q, k, v, g, true), "EMBER_SDPA_CUDA_KERNEL must be simple or");
  }
}

TEST(AttentionTensorCore, CudaGradientsRepeatBitForBit) {
  EMBER_REQUIRE_CUDA();
  const KernelChoice choice("tensor_core");
  const Shape shape = {4, 6, 256, 64};
  const Tensor q = input(shape, 4000, kBF16), k = input(shape, 4001, kBF16),
               v = input(shape, 4002, kBF16), g = input(shape, 4003, kBF16);
  const Grads a = on_cuda(q, k, v, g, true), b = on_cuda(q, k, v, g, true);
  EXPECT_TRUE(equal(a.out, b.out));
  EXPECT_TRUE(equal(a.q, b.q));
  EXPECT_TRUE(equal(a.k, b.k));
  EXPECT_TRUE(equal(a.v, b.v));
}

}  // namespace
}  // namespace ember::testing::attention_tc

// conv2d forward and backward on the CPU for the ResNet-20 (CIFAR) shapes: one JSON line per
// shape and pass with ember's median milliseconds. bench/conv_torch.py prints the same keys
// for PyTorch's CPU conv2d (oneDNN), as the reference to compare against.
//
//   conv_bench [--batch 128] [--threads 2]
//   EMBER_CPU_CONV=im2col conv_bench ...   (f32 on im2col + OpenBLAS instead of oneDNN)
#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ember/ember.h>
#include <ember/tensor/detail/layer_backward.h>

#include "bench_util.h"

namespace {

using ember::Tensor;
using ember::bench::JsonLine;

struct Shape {
  const char* name;
  int64_t in, out, size, kernel, stride, padding;
};

// The convolutions of ResNet-20: the stem, each stage's 3x3 convs (the first of stages 2 and
// 3 with stride 2) and the 1x1 stride-2 projections of the downsampling shortcuts.
const std::vector<Shape> kShapes = {
    {"stem_3x16_32", 3, 16, 32, 3, 1, 1},       {"s1_16x16_32", 16, 16, 32, 3, 1, 1},
    {"s2_16x32_32_s2", 16, 32, 32, 3, 2, 1},    {"s2_32x32_16", 32, 32, 16, 3, 1, 1},
    {"s3_32x64_16_s2", 32, 64, 16, 3, 2, 1},    {"s3_64x64_8", 64, 64, 8, 3, 1, 1},
    {"down_16x32_1x1_s2", 16, 32, 32, 1, 2, 0}, {"down_32x64_1x1_s2", 32, 64, 16, 1, 2, 0},
};

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 128;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
      batch = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: conv_bench [--batch N] [--threads T]\n");
      return 2;
    }
  }
  const char* impl_env = std::getenv("EMBER_CPU_CONV");
  // "ember" is the default path: oneDNN for f32 when ember was built with it.
  const std::string impl =
      impl_env != nullptr && std::strcmp(impl_env, "im2col") == 0 ? "ember_im2col" : "ember";
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  ember::NoGradGuard no_grad;
  ember::Generator gen(0);
  for (const Shape& s : kShapes) {
    const Tensor x = ember::normal({batch, s.in, s.size, s.size}, 0.0, 1.0, ember::kF32, &gen);
    const Tensor w = ember::normal({s.out, s.in, s.kernel, s.kernel}, 0.0, 0.1, ember::kF32, &gen);
    const ember::Pair stride{s.stride, s.stride}, padding{s.padding, s.padding};
    const Tensor y = ember::conv2d(x, w, {}, stride, padding);
    const Tensor gy = ember::normal(y.sizes(), 0.0, 1.0, ember::kF32, &gen);
    ember::detail::Conv2dParams params;
    params.stride[0] = params.stride[1] = s.stride;
    params.padding[0] = params.padding[1] = s.padding;
    // The stem's input is data: only the weight needs a gradient there (as in training).
    const bool stem = std::strncmp(s.name, "stem", 4) == 0;
    const auto forward = [&] { ember::conv2d(x, w, {}, stride, padding); };
    const auto backward = [&] {
      ember::detail::conv2d_backward(gy, x, w, params, {!stem, true, false});
    };
    const std::vector<double> secs = ember::bench::median_seconds({forward, backward}, [] {});
    const char* passes[] = {"forward", "backward"};
    for (int p = 0; p < 2; ++p) {
      JsonLine()
          .add("bench", "conv")
          .add("impl", impl)
          .add("shape", s.name)
          .add("pass", passes[p])
          .add("batch", static_cast<long long>(batch))
          .add("threads", threads)
          .add("ms", secs[static_cast<size_t>(p)] * 1e3)
          .print();
    }
  }
  return 0;
}

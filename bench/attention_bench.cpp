// Scaled-dot-product attention forward + backward on the CPU at GPT-ish sizes (default
// B=4, H=6, L=256, D=64, f32, causal): ember's fused op against the same attention composed
// from ember's ops (softmax(q k^T * scale + mask) v, which materialises the L x L weights),
// median milliseconds per forward+backward, one JSON line each. bench/attention_torch.py
// prints the same keys for PyTorch 1.13's composition (it has no fused op), the reference.
//
//   attention_bench [--batch 4] [--heads 6] [--length 256] [--dim 64] [--threads 2]
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include <ember/ember.h>

#include "bench_util.h"

namespace {

using ember::Tensor;

Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t length = q.size(-2);
  const Tensor above =
      ember::gt(ember::arange(length).view({1, length}), ember::arange(length).view({length, 1}));
  const Tensor scores =
      ember::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  return ember::matmul(
      ember::softmax(ember::masked_fill(scores, above, -std::numeric_limits<double>::infinity()),
                     -1),
      v);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 4, heads = 6, length = 256, dim = 64;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const auto next = [&] { return i + 1 < argc ? std::atoll(argv[++i]) : -1; };
    if (std::strcmp(argv[i], "--batch") == 0) {
      batch = next();
    } else if (std::strcmp(argv[i], "--heads") == 0) {
      heads = next();
    } else if (std::strcmp(argv[i], "--length") == 0) {
      length = next();
    } else if (std::strcmp(argv[i], "--dim") == 0) {
      dim = next();
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      threads = static_cast<int>(next());
    } else {
      std::fprintf(stderr,
                   "usage: attention_bench [--batch B] [--heads H] [--length L] [--dim D] "
                   "[--threads T]\n");
      return 2;
    }
  }
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  ember::Generator gen(0);
  const ember::Shape shape = {batch, heads, length, dim};
  const auto leaf = [&] {
    return ember::normal(shape, 0.0, 1.0, ember::kF32, &gen).requires_grad_();
  };
  const Tensor q = leaf(), k = leaf(), v = leaf();
  const Tensor grad = ember::normal(shape, 0.0, 1.0, ember::kF32, &gen);
  const auto step = [&](const auto& attention) {
    return [&, attention] {
      for (const Tensor* t : {&q, &k, &v}) t->set_grad({});
      attention(q, k, v).backward(grad);
    };
  };
  const std::vector<double> secs =
      ember::bench::median_seconds({step([](const Tensor& a, const Tensor& b, const Tensor& c) {
                                      return ember::scaled_dot_product_attention(a, b, c, true);
                                    }),
                                    step(composed)},
                                   [] {});
  const char* impls[] = {"ember_fused", "ember_composed"};
  for (size_t i = 0; i < 2; ++i) {
    ember::bench::JsonLine()
        .add("bench", "attention")
        .add("impl", impls[i])
        .add("pass", "forward_backward")
        .add("batch", static_cast<long long>(batch))
        .add("heads", static_cast<long long>(heads))
        .add("length", static_cast<long long>(length))
        .add("dim", static_cast<long long>(dim))
        .add("causal", true)
        .add("threads", threads)
        .add("ms", secs[i] * 1e3)
        .print();
  }
  return 0;
}

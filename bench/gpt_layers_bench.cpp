// layer_norm and gelu (exact and tanh) forward, and forward + backward through autograd, on
// the CPU at GPT-2 small's widths: one JSON line per op and pass with ember's median
// milliseconds. bench/gpt_layers_torch.py prints the same keys for PyTorch's CPU ops, the
// reference to compare against; run both in the same session.
//
//   gpt_layers_bench [--rows 2048] [--threads 2]
#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include <ember/ember.h>

#include "bench_util.h"

namespace {

using ember::Tensor;

void report(const std::string& op, const char* pass, const ember::Shape& shape, int threads,
            double seconds) {
  ember::bench::JsonLine()
      .add("bench", "gpt_layers")
      .add("impl", "ember")
      .add("op", op)
      .add("pass", pass)
      .add("shape", ember::shape_str(shape))
      .add("threads", threads)
      .add("ms", seconds * 1e3)
      .print();
}

// Times f(x) without autograd, and f(x) with x (and the parameters) requiring grad followed
// by backward with a fixed output gradient.
void bench_op(const std::string& op, const Tensor& x, const std::function<Tensor(const Tensor&)>& f,
              int threads) {
  {
    ember::NoGradGuard no_grad;
    const auto t = ember::bench::median_seconds({[&] { f(x); }}, [] {});
    report(op, "forward", x.sizes(), threads, t[0]);
  }
  Tensor leaf = x.detach().clone();
  leaf.requires_grad_();
  const Tensor grad = ember::randn(x.sizes());
  const auto t = ember::bench::median_seconds({[&] {
                                                leaf.set_grad(Tensor());
                                                f(leaf).backward(grad);
                                              }},
                                              [] {});
  report(op, "forward_backward", x.sizes(), threads, t[0]);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 2048;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
      rows = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      threads = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: gpt_layers_bench [--rows N] [--threads T]\n");
      return 2;
    }
  }
  omp_set_num_threads(threads);
  ember::manual_seed(0);
  const int64_t width = 768;
  Tensor w = ember::ones({width}), b = ember::zeros({width});
  w.requires_grad_();
  b.requires_grad_();
  bench_op(
      "layer_norm", ember::randn({rows, width}),
      [&](const Tensor& x) { return ember::layer_norm(x, {width}, w, b); }, threads);
  const Tensor hidden = ember::randn({rows, 4 * width});
  bench_op(
      "gelu", hidden, [](const Tensor& x) { return ember::gelu(x); }, threads);
  bench_op(
      "gelu_tanh", hidden,
      [](const Tensor& x) { return ember::gelu(x, ember::GeluApproximate::kTanh); }, threads);
  return 0;
}

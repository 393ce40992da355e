// Scaled-dot-product attention at GPT-ish sizes (default B=4, H=6, L=256, D=64, f32, causal,
// CPU): ember's fused op against the same attention composed from ember's ops (softmax(q k^T
// * scale + mask) v, which materialises the L x L weights); median milliseconds per forward
// (no autograd) and per forward+backward, one JSON line each. On CUDA the fused op runs once
// per kernel (EMBER_SDPA_CUDA_KERNEL=simple and =tensor_core, see tensor/cuda/attention.cu).
// bench/attention_torch.py prints the same keys for PyTorch (F.scaled_dot_product_attention
// where it has it, else the composition); bench/attention_compare.sh runs both over sizes.
//
//   attention_bench [--batch 4] [--heads 6] [--length 256] [--dim 64] [--threads 2]
//                   [--device cpu|cuda] [--dtype f32|bf16|f16] [--causal 1|0] [--no-composed]
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include <ember/ember.h>

#include "bench_util.h"

namespace {

using ember::Tensor;

Tensor composed(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  Tensor scores =
      ember::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal) {
    const int64_t length = q.size(-2);
    const Tensor above =
        ember::gt(ember::arange(length).view({1, length}), ember::arange(length).view({length, 1}))
            .to(q.device());
    scores = ember::masked_fill(scores, above, -std::numeric_limits<double>::infinity());
  }
  return ember::matmul(ember::softmax(scores, -1), v);
}

int usage() {
  std::fprintf(stderr,
               "usage: attention_bench [--batch B] [--heads H] [--length L] [--dim D] "
               "[--threads T] [--device cpu|cuda] [--dtype f32|bf16|f16] [--causal 1|0] "
               "[--no-composed]\n");
  return 2;
}

int run(int64_t batch, int64_t heads, int64_t length, int64_t dim, int threads, bool causal,
        bool with_composed, const std::string& device_name, const std::string& dtype_name) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  const ember::Device device(device_name);
  const ember::DType dtype =
      dtype_name == "bf16" ? ember::kBF16 : (dtype_name == "f16" ? ember::kF16 : ember::kF32);
  ember::Generator gen(0);
  const ember::Shape shape = {batch, heads, length, dim};
  const auto make = [&] {
    return ember::normal(shape, 0.0, 1.0, ember::kF32, &gen).to(dtype).to(device);
  };
  const Tensor q = make().requires_grad_(), k = make().requires_grad_(),
               v = make().requires_grad_(), grad = make();

  using Attention = std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)>;
  struct Impl {
    std::string name;
    const char* kernel;  // EMBER_SDPA_CUDA_KERNEL while it runs (null: leave as is)
    Attention f;
  };
  const Attention fused = [causal](const Tensor& a, const Tensor& b, const Tensor& c) {
    return ember::scaled_dot_product_attention(a, b, c, causal);
  };
  std::vector<Impl> impls;
  if (device.is_cuda()) {
    impls.push_back({"ember_fused_simple", "simple", fused});
    impls.push_back({"ember_fused_tensor_core", "tensor_core", fused});
  } else {
    impls.push_back({"ember_fused", nullptr, fused});
  }
  if (with_composed) {
    impls.push_back(
        {"ember_composed", nullptr, [causal](const Tensor& a, const Tensor& b, const Tensor& c) {
           return composed(a, b, c, causal);
         }});
  }
  const auto select = [](const Impl& impl) {
    if (impl.kernel != nullptr) setenv("EMBER_SDPA_CUDA_KERNEL", impl.kernel, 1);
  };
  std::vector<std::function<void()>> forward, forward_backward;
  for (const Impl& impl : impls) {
    forward.push_back([&, impl] {
      select(impl);
      ember::NoGradGuard no_grad;
      impl.f(q, k, v);
    });
    forward_backward.push_back([&, impl] {
      select(impl);
      for (const Tensor* t : {&q, &k, &v}) t->set_grad({});
      impl.f(q, k, v).backward(grad);
    });
  }
  const auto sync = [&] {
    if (device.is_cuda()) ember::cuda::synchronize();
  };
  const std::vector<double> fwd = ember::bench::median_seconds(forward, sync);
  const std::vector<double> fwd_bwd = ember::bench::median_seconds(forward_backward, sync);
  // FlashAttention's count: 4 B H L^2 D multiply-adds x2 forward (half of it causal), backward
  // 2.5 times the forward.
  const double fwd_flops = 4.0 * static_cast<double>(batch * heads) * static_cast<double>(length) *
                           static_cast<double>(length) * static_cast<double>(dim) *
                           (causal ? 0.5 : 1.0);
  for (size_t i = 0; i < impls.size(); ++i) {
    for (const auto& [pass, secs, flops] :
         {std::tuple{"forward", fwd[i], fwd_flops},
          std::tuple{"forward_backward", fwd_bwd[i], 3.5 * fwd_flops}}) {
      ember::bench::JsonLine line;
      line.add("bench", "attention")
          .add("impl", impls[i].name)
          .add("pass", pass)
          .add("device", device_name)
          .add("dtype", dtype_name)
          .add("batch", static_cast<long long>(batch))
          .add("heads", static_cast<long long>(heads))
          .add("length", static_cast<long long>(length))
          .add("dim", static_cast<long long>(dim))
          .add("causal", causal);
      if (!device.is_cuda()) line.add("threads", threads);
      line.add("ms", secs * 1e3).add("tflops", flops / secs * 1e-12).print();
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 4, heads = 6, length = 256, dim = 64;
  int threads = 2;
  bool causal = true, with_composed = true;
  std::string device_name = "cpu", dtype_name = "f32";
  for (int i = 1; i < argc; ++i) {
    const auto text = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    const auto number = [&] { return std::atoll(text().c_str()); };
    if (std::strcmp(argv[i], "--batch") == 0) {
      batch = number();
    } else if (std::strcmp(argv[i], "--heads") == 0) {
      heads = number();
    } else if (std::strcmp(argv[i], "--length") == 0) {
      length = number();
    } else if (std::strcmp(argv[i], "--dim") == 0) {
      dim = number();
    } else if (std::strcmp(argv[i], "--threads") == 0) {
      threads = static_cast<int>(number());
    } else if (std::strcmp(argv[i], "--device") == 0) {
      device_name = text();
    } else if (std::strcmp(argv[i], "--dtype") == 0) {
      dtype_name = text();
    } else if (std::strcmp(argv[i], "--causal") == 0) {
      causal = number() != 0;
    } else if (std::strcmp(argv[i], "--no-composed") == 0) {
      with_composed = false;
    } else {
      return usage();
    }
  }
  if ((device_name != "cpu" && device_name != "cuda") ||
      (dtype_name != "f32" && dtype_name != "bf16" && dtype_name != "f16")) {
    return usage();
  }
  try {
    return run(batch, heads, length, dim, threads, causal, with_composed, device_name, dtype_name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "attention_bench: %s\n", e.what());
    return 1;
  }
}

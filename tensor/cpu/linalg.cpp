// CPU GEMM on OpenBLAS: row-major cblas_sgemm / cblas_dgemm, one call per batch entry. f16
// and bf16 products accumulate in f32 and are rounded once into the 16-bit output, as cuBLAS
// does with CUBLAS_COMPUTE_32F: bf16 on oneDNN's bf16 matmul where the CPU has bf16
// instructions (AVX512-BF16, AMX), otherwise by widening the operands to f32 (exactly) for
// sgemm.
#include <cblas.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../detail/dispatch.h"
#include "cpu_kernels.h"
#include "onednn.h"

namespace ember::detail {
namespace {

// C = beta * C over an m x n block with row stride ldc (the k == 0 product is empty).
template <typename T>
void scale_block(T* c, int64_t m, int64_t n, int64_t ldc, T beta) {
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      for (int64_t j = 0; j < n; ++j) row[j] = T(0);  // no NaN * 0: C is not read
    } else {
      for (int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
}

template <typename T>
void gemm_typed(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  const auto ta = g.trans_a ? CblasTrans : CblasNoTrans;
  const auto tb = g.trans_b ? CblasTrans : CblasNoTrans;
  for (int64_t i = 0; i < g.batch; ++i) {
    const T* ai = a + i * g.stride_a;
    const T* bi = b + i * g.stride_b;
    T* ci = c + i * g.stride_c;
    if (g.k == 0) {
      scale_block(ci, g.m, g.n, g.ldc, static_cast<T>(g.beta));
      continue;
    }
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, ta, tb, static_cast<blasint>(g.m), static_cast<blasint>(g.n),
                  static_cast<blasint>(g.k), static_cast<float>(g.alpha), ai,
                  static_cast<blasint>(g.lda), bi, static_cast<blasint>(g.ldb),
                  static_cast<float>(g.beta), ci, static_cast<blasint>(g.ldc));
    } else {
      cblas_dgemm(CblasRowMajor, ta, tb, static_cast<blasint>(g.m), static_cast<blasint>(g.n),
                  static_cast<blasint>(g.k), g.alpha, ai, static_cast<blasint>(g.lda), bi,
                  static_cast<blasint>(g.ldb), g.beta, ci, static_cast<blasint>(g.ldc));
    }
  }
}

// A rows x cols row-major matrix with leading dim ld, widened into a packed f32 buffer.
template <typename T>
void widen(std::vector<float>& dst, const T* src, int64_t rows, int64_t cols, int64_t ld) {
  dst.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = src + i * ld;
    float* out = dst.data() + i * cols;
    for (int64_t j = 0; j < cols; ++j) out[j] = static_cast<float>(row[j]);
  }
}

#if EMBER_WITH_DNNL
// C (f32, contiguous [batch, m, n], holding C's values when beta != 0) = alpha * A @ B +
// beta * C for bf16 A and B on oneDNN's matmul (f32 accumulation); one primitive per layout,
// created once. False when oneDNN cannot run it.
bool matmul_bf16_onednn(const GemmArgs& g, float* c) {
  using dnnl::memory;
  // A batch dim of stride 0 (a broadcast operand) is a batch of one, which oneDNN broadcasts.
  const int64_t batch_a = g.stride_a == 0 ? 1 : g.batch, batch_b = g.stride_b == 0 ? 1 : g.batch;
  const auto desc = [](int64_t batch, int64_t rows, int64_t cols, bool trans, int64_t ld,
                       int64_t stride, memory::data_type dt) {
    const int64_t batch_stride = batch == 1 ? rows * cols : stride;
    return memory::desc(
        {batch, rows, cols}, dt,
        trans ? memory::dims{batch_stride, 1, ld} : memory::dims{batch_stride, ld, 1});
  };
  const memory::desc a =
      desc(batch_a, g.m, g.k, g.trans_a, g.lda, g.stride_a, memory::data_type::bf16);
  const memory::desc b =
      desc(batch_b, g.k, g.n, g.trans_b, g.ldb, g.stride_b, memory::data_type::bf16);
  const memory::desc out = desc(g.batch, g.m, g.n, false, g.n, g.m * g.n, memory::data_type::f32);
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, int64_t,
                         int64_t, bool, int64_t, int64_t, double, double>;
  const Key key{g.m,   g.n,        g.k,       g.batch, batch_a,    batch_b, g.trans_a,
                g.lda, g.stride_a, g.trans_b, g.ldb,   g.stride_b, g.alpha, g.beta};
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<dnnl::matmul>> cache;
  dnnl::matmul* prim = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = cache.find(key);
    if (it == cache.end()) {
      std::unique_ptr<dnnl::matmul> made;
      try {
        dnnl::primitive_attr attr;
        if (g.alpha != 1.0) attr.set_output_scales(0, {static_cast<float>(g.alpha)});
        if (g.beta != 0.0) {
          dnnl::post_ops ops;
          ops.append_sum(static_cast<float>(g.beta));
          attr.set_post_ops(ops);
        }
        made = std::make_unique<dnnl::matmul>(
            dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, out), attr, onednn::engine()));
      } catch (const dnnl::error&) {
        made = nullptr;  // a layout oneDNN does not take: widen instead
      }
      it = cache.emplace(key, std::move(made)).first;
    }
    prim = it->second.get();
  }
  if (prim == nullptr) return false;
  dnnl::stream st(onednn::engine());
  prim->execute(st, {{DNNL_ARG_SRC, memory(a, onednn::engine(), const_cast<void*>(g.a))},
                     {DNNL_ARG_WEIGHTS, memory(b, onednn::engine(), const_cast<void*>(g.b))},
                     {DNNL_ARG_DST, memory(out, onednn::engine(), c)}});
  st.wait();
  return true;
}

// bf16 on oneDNN, when the CPU computes bf16 natively; false to take the widening path.
bool gemm_bf16_native(const GemmArgs& g) {
  if (g.k == 0 || !onednn::native_bf16()) return false;
  std::vector<float> c(static_cast<size_t>(g.batch * g.m * g.n), 0.0f);
  BFloat16* out = static_cast<BFloat16*>(g.c);
  if (g.beta != 0.0) {
    for (int64_t i = 0; i < g.batch; ++i)
      for (int64_t r = 0; r < g.m; ++r)
        for (int64_t j = 0; j < g.n; ++j)
          c[(i * g.m + r) * g.n + j] = static_cast<float>(out[i * g.stride_c + r * g.ldc + j]);
  }
  if (!matmul_bf16_onednn(g, c.data())) return false;
  for (int64_t i = 0; i < g.batch; ++i)
    for (int64_t r = 0; r < g.m; ++r)
      for (int64_t j = 0; j < g.n; ++j)
        out[i * g.stride_c + r * g.ldc + j] = BFloat16(c[(i * g.m + r) * g.n + j]);
  return true;
}
#else
bool gemm_bf16_native(const GemmArgs&) { return false; }
#endif

template <typename T>
void gemm_widened(const GemmArgs& g) {
  const T* a = static_cast<const T*>(g.a);
  const T* b = static_cast<const T*>(g.b);
  T* c = static_cast<T*>(g.c);
  // Stored shapes: op(A) is m x k, so A is k x m when transposed; likewise B.
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  std::vector<float> fa, fb, fc;
  for (int64_t i = 0; i < g.batch; ++i) {
    T* ci = c + i * g.stride_c;
    if (g.beta != 0.0) {
      widen(fc, ci, g.m, g.n, g.ldc);
    } else {
      fc.assign(static_cast<size_t>(g.m * g.n), 0.0f);  // C is not read (no NaN * 0)
    }
    if (g.k > 0) {
      widen(fa, a + i * g.stride_a, a_rows, a_cols, g.lda);
      widen(fb, b + i * g.stride_b, b_rows, b_cols, g.ldb);
      cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                  g.trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(g.m),
                  static_cast<blasint>(g.n), static_cast<blasint>(g.k), static_cast<float>(g.alpha),
                  fa.data(), static_cast<blasint>(std::max<int64_t>(1, a_cols)), fb.data(),
                  static_cast<blasint>(std::max<int64_t>(1, b_cols)), static_cast<float>(g.beta),
                  fc.data(), static_cast<blasint>(std::max<int64_t>(1, g.n)));
    } else if (g.beta != 0.0) {
      for (float& v : fc) v *= static_cast<float>(g.beta);
    }
    for (int64_t r = 0; r < g.m; ++r) {
      for (int64_t j = 0; j < g.n; ++j) ci[r * g.ldc + j] = static_cast<T>(fc[r * g.n + j]);
    }
  }
}

void gemm_cpu(const GemmArgs& args) {
  EMBER_ASSERT(args.device.is_cpu(), "gemm_cpu got a ", args.device.str(), " operand");
  EMBER_ASSERT(args.m >= 0 && args.n >= 0 && args.k >= 0 && args.batch >= 0);
  if (args.m == 0 || args.n == 0 || args.batch == 0) return;
  GemmArgs g = args;
  if (g.bias != nullptr) {
    // The bias epilogue as addmm's copy: every row of C starts as the bias, then beta 1.
    EMBER_ASSERT(g.beta == 0.0, "gemm_cpu: a bias epilogue with beta ", g.beta);
    const size_t row_bytes = static_cast<size_t>(g.n) * element_size(g.dtype);
    auto* c = static_cast<std::byte*>(g.c);
    const auto elem = static_cast<int64_t>(element_size(g.dtype));
    for (int64_t i = 0; i < g.batch; ++i) {
      for (int64_t r = 0; r < g.m; ++r) {
        std::memcpy(c + (i * g.stride_c + r * g.ldc) * elem, g.bias, row_bytes);
      }
    }
    g.bias = nullptr;
    g.beta = 1.0;
  }
  constexpr int64_t kBlasMax = std::numeric_limits<blasint>::max();
  EMBER_CHECK(g.m <= kBlasMax && g.n <= kBlasMax && g.k <= kBlasMax && g.lda <= kBlasMax &&
                  g.ldb <= kBlasMax && g.ldc <= kBlasMax,
              "matmul", "sizes (m ", g.m, ", n ", g.n, ", k ", g.k, ") exceed the BLAS limit of ",
              kBlasMax, " on cpu");
  switch (g.dtype) {
    case kF32:
      gemm_typed<float>(g);
      break;
    case kF64:
      gemm_typed<double>(g);
      break;
    case kF16:
      gemm_widened<Half>(g);
      break;
    case kBF16:
      if (!gemm_bf16_native(g)) gemm_widened<BFloat16>(g);
      break;
    default:
      EMBER_ASSERT(false, "gemm_cpu got dtype ", g.dtype);
  }
}

// Fused linear's epilogue: out[r, j] = activation(in[r, j] + bias[j]) in one pass, added in
// the accumulation type and rounded once.
template <typename T>
void bias_activation_typed(Activation activation, const Tensor& out, const Tensor& in,
                           const Tensor& bias) {
  using A = acc_t<T>;
  const int64_t n = in.dim() > 0 ? in.size(-1) : 1, rows = n > 0 ? in.numel() / n : 0;
  const T* x = in.data_ptr<T>();
  const T* b = bias.defined() ? bias.data_ptr<T>() : nullptr;
  T* y = out.data_ptr<T>();
  EMBER_ASSERT(activation == Activation::kRelu, "bias_activation: activation ",
               static_cast<int>(activation));
#pragma omp parallel for schedule(static) if (in.numel() >= kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      const A v = static_cast<A>(x[r * n + j]) + (b != nullptr ? static_cast<A>(b[j]) : A(0));
      y[r * n + j] = static_cast<T>(v < A(0) ? A(0) : v);  // relu: NaN passes through
    }
  }
}

void bias_activation_cpu(Activation activation, const Tensor& out, const Tensor& in,
                         const Tensor& bias) {
  EMBER_ASSERT(in.is_contiguous() && out.is_contiguous());
  dispatch_floating(in.dtype(), "linear", [&](auto tag) {
    bias_activation_typed<typename decltype(tag)::type>(activation, out, in, bias);
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(linalg) {
  table.gemm = &gemm_cpu;
  table.bias_activation = &bias_activation_cpu;
}

}  // namespace ember::detail

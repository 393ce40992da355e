// GEMM throughput of ember::mm against the vendor library called directly on the same
// operands in the same run: OpenBLAS cblas_sgemm on the CPU, cuBLAS cublasSgemm on CUDA.
// One JSON line per case, with ratio = ember / vendor, and the precision each side ran in
// ("fp32", or "tf32" on CUDA with --tf32: ember under set_float32_matmul_precision("high"),
// cuBLAS with CUBLAS_TF32_TENSOR_OP_MATH). The CPU always runs fp32.
//
//   gemm_bench [--quick] [--tf32]   (--quick: the sizes up to 512 only)
#include <cblas.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ember/ember.h>

#include "bench_util.h"

#if EMBER_WITH_CUDA
#include <cublas_v2.h>
#endif

namespace {

using ember::Tensor;
using ember::bench::JsonLine;

struct GemmCase {
  std::string name;
  int64_t m, n, k;
  bool trans_a;  // A is the transposed view of a [k, m] tensor
};

std::vector<GemmCase> cases(bool quick) {
  std::vector<GemmCase> out;
  for (int64_t s : {128, 256, 512, 1024, 2048}) {
    if (quick && s > 512) break;
    out.push_back({"square", s, s, s, false});
  }
  // Convolutions lowered to GEMM (im2col) and a classifier head, from CIFAR ResNets at
  // batch 32 and an ImageNet ResNet-18 at batch 8.
  out.push_back({"resnet_cifar_stage1_conv", 32 * 32 * 32, 16, 16 * 9, false});
  out.push_back({"resnet_cifar_stage3_conv", 32 * 8 * 8, 64, 64 * 9, false});
  if (!quick) out.push_back({"resnet18_stage4_conv", 8 * 7 * 7, 512, 512 * 9, false});
  out.push_back({"linear_512x10_batch128", 128, 10, 512, false});
  // A transposed view must reach the library as a transpose flag: no copy, same speed.
  out.push_back(
      {"square_transposed_a", quick ? 512 : 1024, quick ? 512 : 1024, quick ? 512 : 1024, true});
  return out;
}

double gflops(const GemmCase& c, double seconds) {
  return 2.0 * static_cast<double>(c.m) * static_cast<double>(c.n) * static_cast<double>(c.k) /
         seconds * 1e-9;
}

// The operands of one case on `device`: A is [m, k] (a view of a [k, m] tensor when
// trans_a), B is [k, n].
struct Operands {
  Tensor a_storage, a, b;
};

Operands make_operands(const GemmCase& c, ember::Device device) {
  Operands ops;
  ops.a_storage = ember::randn(c.trans_a ? ember::Shape{c.k, c.m} : ember::Shape{c.m, c.k},
                               ember::TensorOptions(ember::kF32, device));
  ops.a = c.trans_a ? ops.a_storage.t() : ops.a_storage;
  ops.b = ember::randn({c.k, c.n}, ember::TensorOptions(ember::kF32, device));
  return ops;
}

void report(const char* backend, const char* vendor, const GemmCase& c, double ember_s,
            double vendor_s, const char* ember_precision, const char* vendor_precision) {
  JsonLine()
      .add("bench", "gemm")
      .add("backend", backend)
      .add("case", c.name)
      .add("m", static_cast<long long>(c.m))
      .add("n", static_cast<long long>(c.n))
      .add("k", static_cast<long long>(c.k))
      .add("trans_a", c.trans_a)
      .add("ember_precision", ember_precision)
      .add(std::string(vendor) + "_precision", vendor_precision)
      .add("ember_gflops", gflops(c, ember_s))
      .add(std::string(vendor) + "_gflops", gflops(c, vendor_s))
      .add("ratio", vendor_s / ember_s)
      .print();
}

void bench_cpu(const GemmCase& c) {
  Operands ops = make_operands(c, ember::kCPU);
  Tensor out = ember::empty({c.m, c.n});
  const float* a = ops.a_storage.data_ptr<float>();
  const float* b = ops.b.data_ptr<float>();
  float* raw_out = out.data_ptr<float>();
  const int m = static_cast<int>(c.m), n = static_cast<int>(c.n), k = static_cast<int>(c.k);
  Tensor result;
  const auto t = ember::bench::median_seconds(
      {[&] { result = ember::mm(ops.a, ops.b); },
       [&] {
         cblas_sgemm(CblasRowMajor, c.trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, k,
                     1.0f, a, c.trans_a ? m : k, b, n, 0.0f, raw_out, n);
       }},
      [] {});
  report("cpu", "openblas", c, t[0], t[1], "fp32", "fp32");
}

#if EMBER_WITH_CUDA
void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) {
    throw ember::Error(std::string("gemm_bench: ") + what + " failed with cuBLAS status " +
                       std::to_string(static_cast<int>(status)));
  }
}

void bench_cuda(const GemmCase& c, cublasHandle_t handle, bool tf32) {
  const ember::Device device = ember::cuda_device(0);
  Operands ops = make_operands(c, device);
  Tensor out = ember::empty({c.m, c.n}, ember::TensorOptions(ember::kF32, device));
  const float* a = ops.a_storage.data_ptr<float>();
  const float* b = ops.b.data_ptr<float>();
  float* raw_out = out.data_ptr<float>();
  const int m = static_cast<int>(c.m), n = static_cast<int>(c.n), k = static_cast<int>(c.k);
  const float one = 1.0f, zero = 0.0f;
  check_cublas(cublasSetStream(handle, ember::cuda::current_stream().handle()), "cublasSetStream");
  Tensor result;
  // Row-major C = A B is column-major C^T = B^T A^T.
  const auto t = ember::bench::median_seconds(
      {[&] { result = ember::mm(ops.a, ops.b); },
       [&] {
         check_cublas(cublasSgemm(handle, CUBLAS_OP_N, c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m,
                                  k, &one, b, n, a, c.trans_a ? m : k, &zero, raw_out, n),
                      "cublasSgemm");
       }},
      [] { ember::cuda::synchronize(); });
  const char* precision = tf32 ? "tf32" : "fp32";
  report("cuda", "cublas", c, t[0], t[1], ember::matmul_allow_tf32() ? "tf32" : "fp32", precision);
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, tf32 = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    tf32 = tf32 || std::strcmp(argv[i], "--tf32") == 0;
  }
  if (tf32) ember::set_float32_matmul_precision("high");
  ember::manual_seed(0);
  for (const GemmCase& c : cases(quick)) bench_cpu(c);
#if EMBER_WITH_CUDA
  if (ember::cuda::is_available()) {
    cublasHandle_t handle = nullptr;
    check_cublas(cublasCreate(&handle), "cublasCreate");
    check_cublas(cublasSetMathMode(handle, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH),
                 "cublasSetMathMode");
    for (const GemmCase& c : cases(quick)) bench_cuda(c, handle, tf32);
    cublasDestroy(handle);
  }
#endif
  return 0;
}

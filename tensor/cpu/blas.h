// One row-major OpenBLAS product for the CPU kernels that call BLAS on their own blocks
// (conv's im2col, attention's tiles). Private to tensor/cpu/.
#pragma once

#include <cblas.h>

#include <cstdint>
#include <type_traits>

namespace ember::detail {

// C[m, n] = alpha * op(A)[m, k] @ op(B)[k, n] + beta * C (row strides lda, ldb, ldc), for
// float or double. An empty C is left alone; with k == 0 the sum is empty: C = beta * C, C not
// read when beta is 0.
template <typename T>
void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
               const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == T(0) ? T(0) : beta * c[i * ldc + j];
    }
    return;
  }
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const auto bi = [](int64_t v) { return static_cast<blasint>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, opa, opb, bi(m), bi(n), bi(k), alpha, a, bi(lda), b, bi(ldb), beta,
                c, bi(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, opa, opb, bi(m), bi(n), bi(k), alpha, a, bi(lda), b, bi(ldb), beta,
                c, bi(ldc));
  }
}

}  // namespace ember::detail

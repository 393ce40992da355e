// A linear layer's bias rides in the GEMM: addmm with a [n] (or [1, n]) input and beta 1 hands
// the bias to the GEMM kernel (written into C before the product on the CPU, cuBLASLt's bias
// epilogue on CUDA), and linear folds a contiguous [..., in] input into one [rows, in] addmm.
// Values and gradients equal the composition matmul + bias; CUDA equals the CPU.
#include "test_util.h"

namespace ember {
namespace {

using testing::expect_close;

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed) {
  Generator gen(seed);
  return uniform(shape, -2.0, 2.0, kF64, &gen).to(dtype);
}

// x @ w^T + b composed from separate ops: the reference for the folded linear.
Tensor composed_linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  return matmul(x, w.t()) + b;
}

TEST(LinearBiasEpilogue, FoldedInputEqualsMatmulPlusBias) {
  for (const Shape& in_shape : {Shape{2, 3, 7}, Shape{2, 2, 3, 7}, Shape{1, 1, 7}}) {
    SCOPED_TRACE(shape_str(in_shape));
    const Tensor x = random_tensor(in_shape, kF64, 1).requires_grad_();
    const Tensor w = random_tensor({4, 7}, kF64, 2).requires_grad_();
    const Tensor b = random_tensor({4}, kF64, 3).requires_grad_();
    const Tensor xr = x.detach().requires_grad_(), wr = w.detach().requires_grad_(),
                 br = b.detach().requires_grad_();
    const Tensor y = linear(x, w, b), ref = composed_linear(xr, wr, br);
    Shape out_shape = in_shape;
    out_shape.back() = 4;
    EXPECT_EQ(y.sizes(), out_shape);
    expect_close(y, ref, 1e-12, 1e-12);
    const Tensor g = random_tensor(out_shape, kF64, 4);
    y.backward(g);
    ref.backward(g);
    expect_close(x.grad(), xr.grad(), 1e-12, 1e-12);
    expect_close(w.grad(), wr.grad(), 1e-12, 1e-12);
    expect_close(b.grad(), br.grad(), 1e-12, 1e-12);
  }
}

TEST(LinearBiasEpilogue, NonContiguousAndEmptyInputs) {
  // A transposed [7, 3, 2] -> [2, 3, 7] view takes the matmul path; same values.
  const Tensor base = random_tensor({7, 3, 2}, kF64, 5);
  const Tensor x = base.permute({2, 1, 0});
  ASSERT_FALSE(x.is_contiguous());
  const Tensor w = random_tensor({4, 7}, kF64, 6), b = random_tensor({4}, kF64, 7);
  expect_close(linear(x, w, b), composed_linear(x.contiguous(), w, b), 1e-12, 1e-12);
  // No rows, and no input features (the output is the bias alone).
  EXPECT_EQ(linear(zeros({0, 3, 7}, kF64), w, b).sizes(), (Shape{0, 3, 4}));
  const Tensor none = linear(zeros({2, 3, 0}, kF64), zeros({4, 0}, kF64), b);
  expect_close(none, b.expand({2, 3, 4}), 0.0, 0.0);
}

TEST(LinearBiasEpilogue, AddmmBiasShapesAndScalars) {
  const Tensor a = random_tensor({5, 6}, kF32, 8), m = random_tensor({6, 3}, kF32, 9);
  const Tensor bias = random_tensor({3}, kF32, 10);
  const Tensor expected = matmul(a, m) + bias;
  // [n] and [1, n] take the epilogue; alpha scales the product only.
  expect_close(addmm(bias, a, m), expected, 1e-6, 1e-6);
  expect_close(addmm(bias.reshape({1, 3}), a, m), expected, 1e-6, 1e-6);
  expect_close(addmm(bias, a, m, 1, 2), matmul(a, m) * 2 + bias, 1e-6, 1e-6);
  // Other betas and a full [m, n] input keep the copy path.
  expect_close(addmm(bias, a, m, 0.5, 1), matmul(a, m) + bias * 0.5, 1e-6, 1e-6);
  const Tensor full = random_tensor({5, 3}, kF32, 11);
  expect_close(addmm(full, a, m), matmul(a, m) + full, 1e-6, 1e-6);
  // A 0-d input broadcasts like any other (a single output column makes its size match).
  const Tensor one_column = random_tensor({6, 1}, kF32, 13),
               scalar = ember::full({}, 0.5, TensorOptions(kF32));
  expect_close(addmm(scalar, a, one_column), matmul(a, one_column) + scalar, 1e-6, 1e-6);
  // A bias read from an offset (not 16-byte aligned) view.
  const Tensor wide = random_tensor({4}, kF32, 12);
  const Tensor shifted = wide.narrow(0, 1, 3);
  expect_close(addmm(shifted, a, m), matmul(a, m) + shifted, 1e-6, 1e-6);
}

// CUDA: cuBLASLt's bias epilogue (or, where it has no algorithm, the bias written into C) equals
// the CPU for every floating dtype, 2-D and folded inputs, transposed weights, misaligned bias.
TEST(LinearBiasEpilogue, CudaEqualsCpu) {
  EMBER_REQUIRE_CUDA();
  for (DType t : {kF64, kF32, kF16, kBF16}) {
    SCOPED_TRACE(t);
    const double tol = t == kF64 ? 1e-12 : t == kF32 ? 1e-4 : t == kF16 ? 4e-3 : 2e-2;
    for (const Shape& in_shape : {Shape{8, 64}, Shape{4, 5, 64}, Shape{3, 300}}) {
      SCOPED_TRACE(shape_str(in_shape));
      const int64_t in = in_shape.back();
      const Tensor x = random_tensor(in_shape, t, 20);
      const Tensor w = random_tensor({48, in}, t, 21);
      const Tensor b = random_tensor({49}, t, 22).narrow(0, 1, 48);  // misaligned by one
      const Tensor cpu = linear(x.to(kF32), w.to(kF32), b.to(kF32)).to(t);
      expect_close(linear(x.cuda(), w.cuda(), b.cuda()).cpu(), cpu, tol, tol);
      // A weight stored [in, out] and used transposed (trans flags swap in the GEMM).
      const Tensor wt = w.t().contiguous();
      expect_close(addmm(b.cuda(), x.reshape({-1, in}).cuda(), wt.cuda()).cpu(),
                   cpu.reshape({-1, 48}), tol, tol);
    }
    // The empty product plus the bias.
    const Tensor b = random_tensor({3}, t, 23);
    expect_close(addmm(b.cuda(), zeros({2, 0}, t).cuda(), zeros({0, 3}, t).cuda()).cpu(),
                 b.expand({2, 3}), 0.0, 0.0);
  }
}

TEST(LinearBiasEpilogue, CudaGradientsEqualCpu) {
  EMBER_REQUIRE_CUDA();
  const Tensor x = random_tensor({4, 5, 32}, kF32, 30), w = random_tensor({16, 32}, kF32, 31);
  const Tensor b = random_tensor({16}, kF32, 32), g = random_tensor({4, 5, 16}, kF32, 33);
  std::vector<Tensor> grads[2];
  for (int on_cuda = 0; on_cuda < 2; ++on_cuda) {
    const Device d = on_cuda ? cuda_device() : Device();
    const Tensor xd = x.to(d).requires_grad_(), wd = w.to(d).requires_grad_(),
                 bd = b.to(d).requires_grad_();
    linear(xd, wd, bd).backward(g.to(d));
    grads[on_cuda] = {xd.grad().cpu(), wd.grad().cpu(), bd.grad().cpu()};
  }
  for (size_t i = 0; i < 3; ++i) expect_close(grads[1][i], grads[0][i], 1e-4, 1e-4);
}

}  // namespace
}  // namespace ember

// matmul, mm, bmm, addmm on the gemm kernel (OpenBLAS on the CPU, cuBLAS on CUDA).
#include <algorithm>
#include <optional>

#include "detail/autocast_policy.h"
#include "detail/autograd_hooks.h"
#include "detail/op_def.h"
#include "detail/op_utils.h"
#include "ops.h"

namespace ember {
namespace {

// --- descriptors --------------------------------------------------------------------------

std::vector<Tensor> mm_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {c.needs(0) ? mm(g, c.in(1).t()) : Tensor(), c.needs(1) ? mm(c.in(0).t(), g) : Tensor()};
}
std::vector<Tensor> bmm_backward(const detail::BackwardContext& c, const Tensor& g) {
  return {c.needs(0) ? bmm(g, c.in(1).transpose(1, 2)) : Tensor(),
          c.needs(1) ? bmm(c.in(0).transpose(1, 2), g) : Tensor()};
}
// OpArgs::a, b: beta and alpha.
std::vector<Tensor> addmm_backward(const detail::BackwardContext& c, const Tensor& g) {
  const double beta = c.args().a, alpha = c.args().b;
  return {c.needs(0) ? detail::sum_to(beta == 1.0 ? g : g * beta, c.shape(0)) : Tensor(),
          c.needs(1) ? mm(g, c.in(2).t()) * alpha : Tensor(),
          c.needs(2) ? mm(c.in(1).t(), g) * alpha : Tensor()};
}

EMBER_OP(kMmOp, detail::define_op("mm", "MmBackward", detail::saves({0, 1}, false), mm_backward,
                                  detail::CastPolicy::kLowerPrecision,
                                  detail::uses_kernels({EMBER_KERNEL(gemm)})));
EMBER_OP(kBmmOp, detail::define_op("bmm", "BmmBackward", detail::saves({0, 1}, false), bmm_backward,
                                   detail::CastPolicy::kLowerPrecision,
                                   detail::uses_kernels({EMBER_KERNEL(gemm)})));
EMBER_OP(kAddmmOp, detail::define_op("addmm", "AddmmBackward", detail::saves({1, 2}, false),
                                     addmm_backward, detail::CastPolicy::kLowerPrecision,
                                     detail::uses_kernels({EMBER_KERNEL(gemm)})));
EMBER_OP(kMatmulOp, detail::define_composite("matmul", detail::CastPolicy::kLowerPrecision));

void check_operands(const Tensor& a, const Tensor& b, const char* op) {
  detail::check_defined(a, op, "a");
  detail::check_defined(b, op, "b");
  detail::check_same_device({&a, &b}, op);
  EMBER_CHECK(a.dtype() == b.dtype(), op, "dtypes ", a.dtype(), " and ", b.dtype(),
              " differ (convert one with .to())");
  const DType t = a.dtype();
  EMBER_CHECK(is_floating(t), op, "dtype ", t,
              " is not supported (expected f32, f64, f16 or bf16)");
}

void check_inner(const Tensor& a, const Tensor& b, int64_t k_a, int64_t k_b, const char* op) {
  EMBER_CHECK(k_a == k_b, op, "shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()),
              " cannot be multiplied (", k_a, " != ", k_b, ")");
}

// The stride of the batch dims (all but the last two) taken as one flat dim, when memory
// allows it; 0 for broadcast (or absent) batch dims.
std::optional<int64_t> flat_batch_stride(const Tensor& t) {
  std::optional<int64_t> stride;
  int64_t expected = 0;
  for (int64_t d = t.dim() - 3; d >= 0; --d) {
    if (t.size(d) == 1) continue;
    if (!stride) {
      stride = t.stride(d);
    } else if (t.stride(d) != expected) {
      return std::nullopt;
    }
    expected = t.stride(d) * t.size(d);
  }
  return stride.value_or(0);
}

// A [rows, cols] matrix with strides (rs, cs) as BLAS sees it: row-major with leading dim
// rs, or the transpose of a row-major [cols, rows] matrix with leading dim cs.
struct BlasLayout {
  bool trans = false;
  int64_t ld = 1;
};

std::optional<BlasLayout> blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= std::max<int64_t>(1, cols))) {
    return BlasLayout{false, rows == 1 ? std::max<int64_t>(1, cols) : rs};
  }
  if ((rows == 1 || rs == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows))) {
    return BlasLayout{true, cols == 1 ? std::max<int64_t>(1, rows) : cs};
  }
  return std::nullopt;
}

// One gemm operand: data, batch stride and layout, with a copy only where strides force it.
struct Operand {
  Tensor holder;  // owns the memory `holder.data_ptr()` points into
  int64_t batch_stride = 0;
  BlasLayout layout;
};

Operand prepare(const Tensor& x) {
  const int64_t rows = x.size(-2), cols = x.size(-1);
  if (x.numel() == 0) return {x, 0, BlasLayout{false, std::max<int64_t>(1, cols)}};
  Operand op{x, 0, {}};
  std::optional<int64_t> stride = flat_batch_stride(x);
  if (!stride) {
    op.holder = x.contiguous();
    stride = rows * cols;
  }
  op.batch_stride = *stride;
  if (const auto layout = blas_layout(rows, cols, op.holder.stride(-2), op.holder.stride(-1))) {
    op.layout = *layout;
    return op;
  }
  if (op.batch_stride == 0) {  // a broadcast matrix: copy it once, not once per batch entry
    Tensor first = op.holder;
    while (first.dim() > 2) first = first.select(0, 0);
    op.holder = first.contiguous();
  } else {
    op.holder = op.holder.contiguous();
    op.batch_stride = rows * cols;
  }
  op.layout = BlasLayout{false, std::max<int64_t>(1, cols)};
  return op;
}

// c (contiguous [batch..., m, n]) = alpha * a @ b + beta * c, where a is [batch..., m, k]
// and b [batch..., k, n] with the same (possibly stride-0) batch dims; with a bias (contiguous
// [n], c's dtype; beta 0) c = alpha * a @ b + bias, the bias added in the GEMM's epilogue.
void run_gemm(const Tensor& c, const Tensor& a, const Tensor& b, double alpha, double beta,
              const char* op, const Tensor& bias = {}) {
  if (c.numel() == 0) return;
  const int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  const Operand pa = prepare(a);
  const Operand pb = prepare(b);
  detail::GemmArgs g;
  g.dtype = c.dtype();
  g.device = c.device();
  g.m = m;
  g.n = n;
  g.k = k;
  g.batch = c.numel() / (m * n);
  g.a = pa.holder.data_ptr();
  g.trans_a = pa.layout.trans;
  g.lda = pa.layout.ld;
  g.stride_a = pa.batch_stride;
  g.b = pb.holder.data_ptr();
  g.trans_b = pb.layout.trans;
  g.ldb = pb.layout.ld;
  g.stride_b = pb.batch_stride;
  g.c = c.data_ptr();
  g.ldc = std::max<int64_t>(1, n);
  g.stride_c = m * n;
  g.alpha = alpha;
  g.beta = beta;
  if (bias.defined()) g.bias = bias.data_ptr();
  detail::require_kernel(detail::kernels_for(c.device(), op).gemm, c.device(), op)(g);
}

Tensor mm_unchecked(const Tensor& a, const Tensor& b, const char* op) {
  Tensor c = empty({a.size(0), b.size(1)}, a.options());
  run_gemm(c, a, b, 1.0, 0.0, op);
  return c;
}

Shape concat(Shape head, std::initializer_list<int64_t> tail) {
  head.insert(head.end(), tail);
  return head;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  if (auto out = detail::autocast(kMmOp, {&a, &b}, [](const auto& x) { return mm(x[0], x[1]); }))
    return *out;
  check_operands(a, b, "mm");
  EMBER_CHECK(a.dim() == 2 && b.dim() == 2, "mm", "expected 2-d tensors, got shapes ",
              shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  check_inner(a, b, a.size(1), b.size(0), "mm");
  detail::AutogradScope scope(kMmOp, {&a, &b});
  return scope.finish(mm_unchecked(a, b, "mm"));
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (auto out = detail::autocast(kBmmOp, {&a, &b}, [](const auto& x) { return bmm(x[0], x[1]); }))
    return *out;
  check_operands(a, b, "bmm");
  EMBER_CHECK(a.dim() == 3 && b.dim() == 3, "bmm", "expected 3-d tensors, got shapes ",
              shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  EMBER_CHECK(a.size(0) == b.size(0), "bmm", "batch sizes ", a.size(0), " and ", b.size(0),
              " differ (shapes ", shape_str(a.sizes()), " and ", shape_str(b.sizes()), ")");
  check_inner(a, b, a.size(2), b.size(1), "bmm");
  detail::AutogradScope scope(kBmmOp, {&a, &b});
  Tensor c = empty({a.size(0), a.size(1), b.size(2)}, a.options());
  run_gemm(c, a, b, 1.0, 0.0, "bmm");
  return scope.finish(c);
}

Tensor addmm(const Tensor& input, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  if (auto out = detail::autocast(kAddmmOp, {&input, &a, &b}, [&](const auto& x) {
        return addmm(x[0], x[1], x[2], beta, alpha);
      }))
    return *out;
  check_operands(a, b, "addmm");
  detail::check_defined(input, "addmm");
  detail::check_same_device({&input, &a}, "addmm");
  EMBER_CHECK(input.dtype() == a.dtype(), "addmm", "input has dtype ", input.dtype(),
              " but the matrices have ", a.dtype());
  EMBER_CHECK(a.dim() == 2 && b.dim() == 2, "addmm", "expected 2-d matrices, got shapes ",
              shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  check_inner(a, b, a.size(1), b.size(0), "addmm");
  const Shape out_shape{a.size(0), b.size(1)};
  EMBER_CHECK(broadcast_shapes(input.sizes(), out_shape, "addmm") == out_shape, "addmm",
              "input of shape ", shape_str(input.sizes()), " cannot broadcast to ",
              shape_str(out_shape));
  detail::AutogradScope scope(kAddmmOp, {&input, &a, &b});
  Tensor c = empty(out_shape, a.options());
  const double beta_value = beta.to_double();
  // A linear layer's bias ([n] or [1, n], beta 1) rides in the GEMM's epilogue instead of a
  // copy into c that the GEMM reads back (cuBLASLt's bias epilogue on CUDA, as PyTorch's).
  const bool bias_epilogue = beta_value == 1.0 && input.dim() >= 1 &&
                             input.numel() == out_shape[1] && input.size(-1) == out_shape[1] &&
                             input.is_contiguous() && out_shape[1] > 0;
  if (bias_epilogue) {
    run_gemm(c, a, b, alpha.to_double(), 0.0, "addmm", input);
  } else {
    // With beta == 0 the input is ignored, NaNs included (as in PyTorch).
    if (beta_value != 0.0) c.copy_(input);
    run_gemm(c, a, b, alpha.to_double(), beta_value, "addmm");
  }
  detail::OpArgs args;
  args.a = beta_value;
  args.b = alpha.to_double();
  return scope.finish(c, std::move(args));
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (auto out =
          detail::autocast(kMatmulOp, {&a, &b}, [](const auto& x) { return matmul(x[0], x[1]); }))
    return *out;
  check_operands(a, b, "matmul");
  const int64_t da = a.dim(), db = b.dim();
  EMBER_CHECK(da >= 1 && db >= 1, "matmul", "both arguments need at least 1 dimension, got shapes ",
              shape_str(a.sizes()), " and ", shape_str(b.sizes()));
  const Tensor a2 = da == 1 ? a.unsqueeze(0) : a;
  const Tensor b2 = db == 1 ? b.unsqueeze(1) : b;
  const int64_t m = a2.size(-2), k = a2.size(-1), n = b2.size(-1);
  check_inner(a, b, k, b2.size(-2), "matmul");

  Tensor out;
  Shape batch;
  if (da <= 2 && db <= 2) {
    out = mm(a2, b2);
  } else if (db <= 2) {
    // [..., m, k] @ [k, n]: fold the batch into the rows, one large gemm.
    batch.assign(a2.sizes().begin(), a2.sizes().end() - 2);
    int64_t rows = m;
    for (const int64_t s : batch) rows *= s;
    out = mm(a2.reshape({rows, k}), b2).view(concat(batch, {m, n}));
  } else if (detail::grad_needed({&a, &b})) {
    // Recording: go through bmm so the product has a backward.
    const Shape batch_a(a2.sizes().begin(), a2.sizes().end() - 2);
    const Shape batch_b(b2.sizes().begin(), b2.sizes().end() - 2);
    batch = broadcast_shapes(batch_a, batch_b, "matmul");
    int64_t count = 1;
    for (const int64_t s : batch) count *= s;
    out = bmm(a2.expand(concat(batch, {m, k})).reshape({count, m, k}),
              b2.expand(concat(batch, {k, n})).reshape({count, k, n}))
              .view(concat(batch, {m, n}));
  } else {
    const Shape batch_a(a2.sizes().begin(), a2.sizes().end() - 2);
    const Shape batch_b(b2.sizes().begin(), b2.sizes().end() - 2);
    batch = broadcast_shapes(batch_a, batch_b, "matmul");
    out = empty(concat(batch, {m, n}), a.options());
    run_gemm(out, a2.expand(concat(batch, {m, k})), b2.expand(concat(batch, {k, n})), 1.0, 0.0,
             "matmul");
  }
  // Drop the dims that 1-d arguments gained.
  Shape shape = batch;
  if (da > 1) shape.push_back(m);
  if (db > 1) shape.push_back(n);
  return out.view(shape);
}

Tensor Tensor::matmul(const Tensor& other) const { return ember::matmul(*this, other); }

}  // namespace ember

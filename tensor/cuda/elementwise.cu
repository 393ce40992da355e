// Elementwise CUDA kernels: fill, copy (any dtype to any dtype), unary, binary and where.
#include "../detail/dispatch.h"
#include "../detail/gelu_math.h"
#include "launch.cuh"

EMBER_KERNELS_BEGIN
namespace {

// --- math in the compute type (float, double or int64) ----------------------------------

__device__ __forceinline__ float math_exp(float x) { return expf(x); }
__device__ __forceinline__ double math_exp(double x) { return exp(x); }
__device__ __forceinline__ float math_log(float x) { return logf(x); }
__device__ __forceinline__ double math_log(double x) { return log(x); }
__device__ __forceinline__ float math_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double math_sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float math_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double math_tanh(double x) { return tanh(x); }
__device__ __forceinline__ float math_pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double math_pow(double x, double y) { return pow(x, y); }

// Integer power by squaring; negative exponents give 0 except for bases 1 and -1.
__device__ __forceinline__ int64_t int_pow(int64_t base, int64_t exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if (base == -1) return (exponent & 1) ? -1 : 1;
    return 0;
  }
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1) result *= base;
    base *= base;
    exponent >>= 1;
  }
  return result;
}

template <typename C>
__device__ __forceinline__ C apply_unary(UnaryOp op, C x, C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case UnaryOp::kNeg:
        return -x;
      case UnaryOp::kAbs:
        return x < C(0) ? -x : x;
      case UnaryOp::kExp:
        return math_exp(x);
      case UnaryOp::kLog:
        return math_log(x);
      case UnaryOp::kSqrt:
        return math_sqrt(x);
      case UnaryOp::kRsqrt:
        return C(1) / math_sqrt(x);
      case UnaryOp::kRelu:
        return x < C(0) ? C(0) : x;  // NaN stays NaN
      case UnaryOp::kSigmoid:
        return C(1) / (C(1) + math_exp(-x));
      case UnaryOp::kTanh:
        return math_tanh(x);
      case UnaryOp::kPowScalar:  // the CPU's exact shortcuts, for bit parity
        if (a == C(2)) return x * x;
        if (a == C(0.5)) return math_sqrt(x);
        if (a == C(1)) return x;
        return math_pow(x, a);
      case UnaryOp::kClamp:
        return x != x ? x : (x < a ? a : (x > b ? b : x));
      case UnaryOp::kGelu:
        return gelu_forward(x, gelu_approximate_of(static_cast<double>(a)));
    }
    return x;
  } else {
    return x;  // integers go through apply_unary_int
  }
}

// Integers: exact where the op is exact, through double where it is not.
__device__ __forceinline__ int64_t apply_unary_int(UnaryOp op, int64_t x, double a, double b) {
  switch (op) {
    case UnaryOp::kNeg:
      return -x;
    case UnaryOp::kAbs:
      return x < 0 ? -x : x;
    case UnaryOp::kRelu:
      return x < 0 ? 0 : x;
    case UnaryOp::kPowScalar:
      return int_pow(x, static_cast<int64_t>(a));
    case UnaryOp::kClamp: {
      const double v = static_cast<double>(x);
      return static_cast<int64_t>(v < a ? a : (v > b ? b : v));
    }
    EMBER_CASES_UNARY_FLOATING_ONLY:  // floating inputs only
      break;
  }
  return static_cast<int64_t>(apply_unary<double>(op, static_cast<double>(x), a, b));
}

template <typename C>
__device__ __forceinline__ C apply_binary(BinaryOp op, C x, C y, C alpha) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case BinaryOp::kAdd:
        return x + alpha * y;
      case BinaryOp::kSub:
        return x - alpha * y;
      case BinaryOp::kMul:
        return x * y;
      case BinaryOp::kReluBackward:
        return y > C(0) ? x : C(0);
      case BinaryOp::kGeluBackward:
        return gelu_backward(x, y, gelu_approximate_of(static_cast<double>(alpha)));
      case BinaryOp::kDiv:
        return x / y;
      case BinaryOp::kPow:
        return math_pow(x, y);
      case BinaryOp::kMaximum:
        return (x != x || y != y) ? x + y : (x > y ? x : y);  // NaN wins
      case BinaryOp::kMinimum:
        return (x != x || y != y) ? x + y : (x < y ? x : y);
      EMBER_CASES_BINARY_COMPARISON:
        break;
    }
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        return x + alpha * y;
      case BinaryOp::kSub:
        return x - alpha * y;
      case BinaryOp::kMul:
        return x * y;
      case BinaryOp::kReluBackward:
        return y > C(0) ? x : C(0);
      case BinaryOp::kDiv:
        return y == 0 ? C(0) : x / y;  // no trap on the GPU; the front end promotes
      case BinaryOp::kPow:
        return int_pow(x, y);
      case BinaryOp::kMaximum:
        return x > y ? x : y;
      case BinaryOp::kMinimum:
        return x < y ? x : y;
      case BinaryOp::kGeluBackward:
      EMBER_CASES_BINARY_COMPARISON:
        break;
    }
  }
  return x;
}

template <typename C>
__device__ __forceinline__ bool apply_compare(BinaryOp op, C x, C y) {
  switch (op) {
    case BinaryOp::kEq:
      return x == y;
    case BinaryOp::kNe:
      return x != y;
    case BinaryOp::kLt:
      return x < y;
    case BinaryOp::kLe:
      return x <= y;
    case BinaryOp::kGt:
      return x > y;
    case BinaryOp::kGe:
      return x >= y;
    EMBER_CASES_BINARY_ARITHMETIC:
      break;
  }
  return false;
}

// --- functors ------------------------------------------------------------------------------

template <typename T>
struct FillFn {
  T value;
  __device__ void operator()(char* const* data, const int64_t* offsets) const {
    element<T>(data, offsets, 0) = value;
  }
};

template <typename To, typename From>
struct CopyFn {
  __device__ void operator()(char* const* data, const int64_t* offsets) const {
    element<To>(data, offsets, 0) = cast_to<To>(element<From>(data, offsets, 1));
  }
};

template <typename T>
struct UnaryFn {
  using C = acc_t<T>;
  UnaryOp op;
  double a, b;
  __device__ void operator()(char* const* data, const int64_t* offsets) const {
    const C x = cast_to<C>(element<T>(data, offsets, 1));
    C y;
    if constexpr (std::is_floating_point_v<C>) {
      // pow's exponent in T's own precision (f16/bf16 round it first, as on the CPU).
      const C pa = op == UnaryOp::kPowScalar ? cast_to<C>(cast_to<T>(a)) : static_cast<C>(a);
      y = apply_unary<C>(op, x, pa, static_cast<C>(b));
    } else {
      y = apply_unary_int(op, x, a, b);
    }
    element<T>(data, offsets, 0) = cast_to<T>(y);
  }
};

template <typename T>
struct BinaryFn {
  using C = acc_t<T>;
  BinaryOp op;
  C alpha;
  __device__ void operator()(char* const* data, const int64_t* offsets) const {
    const C x = cast_to<C>(element<T>(data, offsets, 1));
    const C y = cast_to<C>(element<T>(data, offsets, 2));
    element<T>(data, offsets, 0) = cast_to<T>(apply_binary<C>(op, x, y, alpha));
  }
};

template <typename T>
struct CompareFn {
  using C = acc_t<T>;
  BinaryOp op;
  __device__ void operator()(char* const* data, const int64_t* offsets) const {
    const C x = cast_to<C>(element<T>(data, offsets, 1));
    const C y = cast_to<C>(element<T>(data, offsets, 2));
    element<bool>(data, offsets, 0) = apply_compare<C>(op, x, y);
  }
};

template <typename T>
struct WhereFn {
  __device__ void operator()(char* const* data, const int64_t* offsets) const {
    element<T>(data, offsets, 0) = element<bool>(data, offsets, 1) ? element<T>(data, offsets, 2)
                                                                   : element<T>(data, offsets, 3);
  }
};

// --- table entries -------------------------------------------------------------------------

void fill_cuda(const Tensor& out, Scalar value) {
  if (out.numel() == 0) return;
  KernelContext ctx(out);
  const StridedIter it = make_iter({&out});
  dispatch_all(out.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = value.is_floating() ? cast_to<T>(value.to_double())
                : value.is_bool()   ? cast_to<T>(value.to_bool())
                                    : cast_to<T>(value.to_int());
    launch_elementwise<1>(it, ctx.stream, FillFn<T>{v});
  });
}

void copy_cuda(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  KernelContext ctx(dst);
  const StridedIter it = make_iter({&dst, &src});
  if (dst.dtype() == src.dtype() && it.contiguous) {
    EMBER_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                                     cudaMemcpyDeviceToDevice, ctx.stream));
    return;
  }
  dispatch_all(dst.dtype(), "copy", [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    dispatch_all(src.dtype(), "copy", [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      launch_elementwise<2>(it, ctx.stream, CopyFn<To, From>{});
    });
  });
}

void unary_cuda(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b) {
  if (out.numel() == 0) return;
  KernelContext ctx(out);
  const StridedIter it = make_iter({&out, &in});
  dispatch_all(out.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<2>(it, ctx.stream, UnaryFn<T>{op, a, b});
  });
}

void binary_cuda(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, Scalar alpha) {
  if (out.numel() == 0) return;
  KernelContext ctx(out);
  const StridedIter it = make_iter({&out, &a, &b});
  dispatch_all(a.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = acc_t<T>;
    if (is_comparison(op)) {
      launch_elementwise<3>(it, ctx.stream, CompareFn<T>{op});
    } else {
      launch_elementwise<3>(it, ctx.stream, BinaryFn<T>{op, alpha.to<C>()});
    }
  });
}

void where_cuda(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (out.numel() == 0) return;
  KernelContext ctx(out);
  const StridedIter it = make_iter({&out, &cond, &a, &b});
  dispatch_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<4>(it, ctx.stream, WhereFn<T>{});
  });
}

}  // namespace

EMBER_REGISTER_CUDA_KERNELS(elementwise) {
  table.fill = fill_cuda;
  table.copy = copy_cuda;
  table.unary = unary_cuda;
  table.binary = binary_cuda;
  table.where = where_cuda;
}

EMBER_KERNELS_END  // namespace ember::detail

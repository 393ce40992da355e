// CPU kernels for fill, copy, unary and binary math and where (random draws: random.cpp).
#include <cmath>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../detail/dispatch.h"
#include "../detail/gelu_math.h"
#include "../detail/tensor_iter.h"
#include "convert.h"
#include "cpu_kernels.h"

namespace ember::detail {

namespace {

// Runs out[i] = op(in[i]...) over an iterator whose operand 0 is the output. Dense layouts
// take a flat loop the compiler vectorises; others walk the innermost dim with strides.
template <typename Out, typename... In, typename Op>
void elementwise(const StridedIter& it, Op op) {
  constexpr int kInputs = sizeof...(In);
  const int64_t numel = it.numel;
  if (numel == 0) return;
  [&]<size_t... I>(std::index_sequence<I...>) {
    if (it.contiguous) {
      Out* out = reinterpret_cast<Out*>(it.data[0]);
      const std::tuple<const In*...> ins{reinterpret_cast<const In*>(it.data[I + 1])...};
#pragma omp parallel for if (numel >= kParallelGrain) schedule(static)
      for (int64_t i = 0; i < numel; ++i) out[i] = op(std::get<I>(ins)[i]...);
      return;
    }
    const int last = it.ndim - 1;
    const int64_t inner = it.sizes[last];
    const int64_t outer = numel / inner;
#pragma omp parallel for if (numel >= kParallelGrain) schedule(static)
    for (int64_t o = 0; o < outer; ++o) {
      int64_t offset[kInputs + 1] = {};
      int64_t rest = o;
      for (int d = last - 1; d >= 0; --d) {
        const int64_t idx = rest % it.sizes[d];
        rest /= it.sizes[d];
        for (int k = 0; k <= kInputs; ++k) offset[k] += idx * it.strides[k][d];
      }
      Out* out = reinterpret_cast<Out*>(it.data[0]) + offset[0];
      const int64_t out_stride = it.strides[0][last];
      const std::tuple<const In*...> ins{reinterpret_cast<const In*>(it.data[I + 1]) +
                                         offset[I + 1]...};
      for (int64_t j = 0; j < inner; ++j) {
        out[j * out_stride] = op(std::get<I>(ins)[j * it.strides[I + 1][last]]...);
      }
    }
  }
  (std::index_sequence_for<In...>{});
}

void fill_cpu(const Tensor& out, Scalar value) {
  dispatch_all(out.dtype(), "fill_", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = value.is_floating() ? convert<T>(value.to_double())
                : value.is_bool()   ? convert<T>(value.to_bool())
                                    : convert<T>(value.to_int());
    elementwise<T>(make_iter({&out}), [v]() { return v; });
  });
}

void copy_cpu(const Tensor& dst, const Tensor& src) {
  const StridedIter it = make_iter({&dst, &src});
  if (dst.dtype() == src.dtype() && it.contiguous) {
    std::memcpy(it.data[0], it.data[1], static_cast<size_t>(it.numel) * dst.element_size());
    return;
  }
  dispatch_all(dst.dtype(), "copy_", [&](auto out_tag) {
    using To = typename decltype(out_tag)::type;
    dispatch_all(src.dtype(), "copy_", [&](auto in_tag) {
      using From = typename decltype(in_tag)::type;
      elementwise<To, From>(it, [](From x) { return convert<To>(x); });
    });
  });
}

template <typename T>
T int_pow(T base, int64_t exponent) {
  if (exponent < 0) {  // integer semantics: only |base| == 1 survives
    if (base == T(1)) return T(1);
    if constexpr (std::is_signed_v<T>) {
      if (base == T(-1)) return (exponent % 2 == 0) ? T(1) : T(-1);
    }
    return T(0);
  }
  T result = 1;
  while (exponent > 0) {
    if (exponent & 1) result = static_cast<T>(result * base);
    base = static_cast<T>(base * base);
    exponent >>= 1;
  }
  return result;
}

template <typename T>
void unary_typed(UnaryOp op, const StridedIter& it, double p0, double p1) {
  using A = acc_t<T>;
  auto run = [&](auto f) {
    elementwise<T, T>(it, [f](T x) { return convert<T>(f(convert<A>(x))); });
  };
  if constexpr (kIsFloat<T>) {
    switch (op) {
      case UnaryOp::kNeg:
        return run([](A x) { return -x; });
      case UnaryOp::kAbs:
        return run([](A x) { return std::abs(x); });
      case UnaryOp::kExp:
        return run([](A x) { return std::exp(x); });
      case UnaryOp::kLog:
        return run([](A x) { return std::log(x); });
      case UnaryOp::kSqrt:
        return run([](A x) { return std::sqrt(x); });
      case UnaryOp::kRsqrt:
        return run([](A x) { return A(1) / std::sqrt(x); });
      case UnaryOp::kRelu:
        return run([](A x) { return x < A(0) ? A(0) : x; });
      case UnaryOp::kSigmoid:
        return run([](A x) { return A(1) / (A(1) + std::exp(-x)); });
      case UnaryOp::kTanh:
        return run([](A x) { return std::tanh(x); });
      case UnaryOp::kPowScalar: {
        // The exponent in T's own precision (f16/bf16 round it first, as PyTorch does).
        const A e = convert<A>(convert<T>(p0));
        if (p0 == 2.0) return run([](A x) { return x * x; });
        if (p0 == 0.5) return run([](A x) { return std::sqrt(x); });
        if (p0 == 1.0) return run([](A x) { return x; });
        return run([e](A x) { return std::pow(x, e); });
      }
      case UnaryOp::kClamp: {
        const A lo = static_cast<A>(p0), hi = static_cast<A>(p1);
        return run([lo, hi](A x) { return std::isnan(x) ? x : x < lo ? lo : (x > hi ? hi : x); });
      }
      case UnaryOp::kGelu:  // one loop per form, so each vectorises
        if (gelu_approximate_of(p0) == GeluApproximate::kTanh)
          return run([](A x) { return gelu_forward(x, GeluApproximate::kTanh); });
        return run([](A x) { return gelu_forward(x, GeluApproximate::kNone); });
    }
  } else if constexpr (!std::is_same_v<T, bool>) {
    switch (op) {
      case UnaryOp::kNeg:
        return run([](A x) { return static_cast<A>(-x); });
      case UnaryOp::kAbs:
        if constexpr (std::is_signed_v<T>)
          return run([](A x) { return x < 0 ? static_cast<A>(-x) : x; });
        else
          return run([](A x) { return x; });
      case UnaryOp::kRelu:
        return run([](A x) { return x < 0 ? A(0) : x; });
      case UnaryOp::kPowScalar: {
        const int64_t e = static_cast<int64_t>(p0);
        return run([e](A x) { return int_pow<A>(x, e); });
      }
      case UnaryOp::kClamp: {
        return run([p0, p1](A x) {
          const double v = static_cast<double>(x);
          return static_cast<A>(v < p0 ? p0 : (v > p1 ? p1 : v));
        });
      }
      EMBER_CASES_UNARY_FLOATING_ONLY:  // floating inputs only
        break;
    }
  }
  EMBER_ASSERT(false, "unary op ", static_cast<int>(op), " reached the CPU kernel with dtype ",
               dtype_of<T>);
}

void unary_cpu(UnaryOp op, const Tensor& out, const Tensor& in, double p0, double p1) {
  const StridedIter it = make_iter({&out, &in});
  dispatch_all(out.dtype(), "unary",
               [&](auto tag) { unary_typed<typename decltype(tag)::type>(op, it, p0, p1); });
}

template <typename T>
void binary_typed(BinaryOp op, const StridedIter& it, Scalar alpha_scalar) {
  using A = acc_t<T>;
  auto run = [&](auto f) {
    elementwise<T, T, T>(it, [f](T a, T b) { return convert<T>(f(convert<A>(a), convert<A>(b))); });
  };
  auto compare = [&](auto f) {
    elementwise<bool, T, T>(it, [f](T a, T b) { return f(convert<A>(a), convert<A>(b)); });
  };
  switch (op) {
    case BinaryOp::kEq:
      return compare([](A a, A b) { return a == b; });
    case BinaryOp::kNe:
      return compare([](A a, A b) { return a != b; });
    case BinaryOp::kLt:
      return compare([](A a, A b) { return a < b; });
    case BinaryOp::kLe:
      return compare([](A a, A b) { return a <= b; });
    case BinaryOp::kGt:
      return compare([](A a, A b) { return a > b; });
    case BinaryOp::kGe:
      return compare([](A a, A b) { return a >= b; });
    EMBER_CASES_BINARY_ARITHMETIC:
      break;
  }
  if constexpr (std::is_same_v<T, bool>) {
    switch (op) {
      case BinaryOp::kAdd:
      case BinaryOp::kMaximum:
        return run([](A a, A b) { return static_cast<A>(a || b); });
      case BinaryOp::kMul:
      case BinaryOp::kMinimum:
        return run([](A a, A b) { return static_cast<A>(a && b); });
      case BinaryOp::kSub:
      case BinaryOp::kDiv:
      case BinaryOp::kPow:
      case BinaryOp::kReluBackward:
      case BinaryOp::kGeluBackward:
      EMBER_CASES_BINARY_COMPARISON:
        break;
    }
  } else {
    const A alpha = kIsFloat<T> ? static_cast<A>(alpha_scalar.to_double())
                                : static_cast<A>(alpha_scalar.to_int());
    switch (op) {
      case BinaryOp::kAdd:
        if (alpha == A(1)) return run([](A a, A b) { return static_cast<A>(a + b); });
        return run([alpha](A a, A b) { return static_cast<A>(a + alpha * b); });
      case BinaryOp::kSub:
        if (alpha == A(1)) return run([](A a, A b) { return static_cast<A>(a - b); });
        return run([alpha](A a, A b) { return static_cast<A>(a - alpha * b); });
      case BinaryOp::kMul:
        return run([](A a, A b) { return static_cast<A>(a * b); });
      case BinaryOp::kReluBackward:
        return run([](A a, A b) { return b > A(0) ? a : A(0); });
      case BinaryOp::kGeluBackward:
        if constexpr (kIsFloat<T>) {
          if (gelu_approximate_of(alpha_scalar.to_double()) == GeluApproximate::kTanh)
            return run([](A a, A b) { return gelu_backward(a, b, GeluApproximate::kTanh); });
          return run([](A a, A b) { return gelu_backward(a, b, GeluApproximate::kNone); });
        }
        break;
      case BinaryOp::kDiv:
        if constexpr (kIsFloat<T>) return run([](A a, A b) { return a / b; });
        break;
      case BinaryOp::kPow:
        if constexpr (kIsFloat<T>)
          return run([](A a, A b) { return std::pow(a, b); });
        else
          return run([](A a, A b) { return int_pow<A>(a, static_cast<int64_t>(b)); });
      case BinaryOp::kMaximum:
        if constexpr (kIsFloat<T>)
          return run(
              [](A a, A b) { return std::isnan(a) || std::isnan(b) ? a + b : (a > b ? a : b); });
        else
          return run([](A a, A b) { return a > b ? a : b; });
      case BinaryOp::kMinimum:
        if constexpr (kIsFloat<T>)
          return run(
              [](A a, A b) { return std::isnan(a) || std::isnan(b) ? a + b : (a < b ? a : b); });
        else
          return run([](A a, A b) { return a < b ? a : b; });
      EMBER_CASES_BINARY_COMPARISON:
        break;
    }
  }
  EMBER_ASSERT(false, "binary op ", static_cast<int>(op), " reached the CPU kernel with dtype ",
               dtype_of<T>);
}

void binary_cpu(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, Scalar alpha) {
  const StridedIter it = make_iter({&out, &a, &b});
  dispatch_all(a.dtype(), "binary",
               [&](auto tag) { binary_typed<typename decltype(tag)::type>(op, it, alpha); });
}

void where_cpu(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const StridedIter it = make_iter({&out, &cond, &a, &b});
  dispatch_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    elementwise<T, bool, T, T>(it, [](bool c, T x, T y) { return c ? x : y; });
  });
}

}  // namespace

EMBER_REGISTER_CPU_KERNELS(elementwise) {
  table.fill = fill_cpu;
  table.copy = copy_cpu;
  table.unary = unary_cpu;
  table.binary = binary_cpu;
  table.where = where_cpu;
}

}  // namespace ember::detail

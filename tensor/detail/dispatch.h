// Runs a generic lambda with the C++ type of a runtime dtype:
//   dispatch_all(t.dtype(), "op", [&](auto tag) { using T = typename decltype(tag)::type; ... });
#pragma once

#include <cstdint>
#include <type_traits>

#include "../dtype.h"
#include "../error.h"

namespace ember::detail {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
decltype(auto) dispatch_all(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
    case DType::kFloat16:
      return f(TypeTag<Half>{});
    case DType::kBFloat16:
      return f(TypeTag<BFloat16>{});
    case DType::kInt64:
      return f(TypeTag<int64_t>{});
    case DType::kInt32:
      return f(TypeTag<int32_t>{});
    case DType::kUInt8:
      return f(TypeTag<uint8_t>{});
    case DType::kBool:
      return f(TypeTag<bool>{});
  }
  throw Error(str_cat(op, ": unknown dtype ", static_cast<int>(dtype)));
}

// Floating types only; other dtypes are an ember::Error naming the op.
template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
    case DType::kFloat16:
      return f(TypeTag<Half>{});
    case DType::kBFloat16:
      return f(TypeTag<BFloat16>{});
    default:
      break;
  }
  throw Error(str_cat(op, ": expected a floating dtype, got ", dtype));
}

// For kernels that only move elements: an unsigned integer as wide as one element.
template <typename F>
void dispatch_word(DType dtype, F&& f) {
  switch (element_size(dtype)) {
    case 1:
      return f(TypeTag<uint8_t>{});
    case 2:
      return f(TypeTag<uint16_t>{});
    case 4:
      return f(TypeTag<uint32_t>{});
    case 8:
      return f(TypeTag<uint64_t>{});
    default:
      EMBER_ASSERT(false, "no word type for ", dtype);
  }
}

// The floating element types (f16 and bf16 included).
template <typename T>
inline constexpr bool kIsFloat =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// The accumulation types of an element type T, one trait for the CPU and CUDA kernels:
//   acc_t<T>       the type element math and per-row statistics run in: float for f32, f16
//                  and bf16, double for f64, int64 for integers and bool (values are stored
//                  back modulo T's range, as T's own arithmetic would wrap)
//   wide_acc_t<T>  the CPU reductions' accumulator: double for every floating T, int64 else
template <typename T>
struct AccType {
  using type = int64_t;
  using wide = int64_t;
};
template <>
struct AccType<float> {
  using type = float;
  using wide = double;
};
template <>
struct AccType<double> {
  using type = double;
  using wide = double;
};
template <>
struct AccType<Half> {
  using type = float;
  using wide = double;
};
template <>
struct AccType<BFloat16> {
  using type = float;
  using wide = double;
};
template <typename T>
using acc_t = typename AccType<T>::type;
template <typename T>
using wide_acc_t = typename AccType<T>::wide;

}  // namespace ember::detail

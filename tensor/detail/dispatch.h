// Runs a generic lambda with the C++ type of a runtime dtype:
//   dispatch_all(t.dtype(), "op", [&](auto tag) { using T = typename decltype(tag)::type; ... });
#pragma once

#include <cstdint>

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

// The type kernels accumulate T in: float for the 16-bit floats, double for double, T else.
template <typename T>
struct AccType {
  using type = T;
};
template <>
struct AccType<Half> {
  using type = float;
};
template <>
struct AccType<BFloat16> {
  using type = float;
};
template <>
struct AccType<bool> {
  using type = int64_t;
};
template <typename T>
using acc_t = typename AccType<T>::type;

}  // namespace ember::detail

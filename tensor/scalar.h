// A single number of any dtype, as ops that take a value (fill, add(x, 2.5), clamp) see it.
// It keeps the value exactly (a double, an int64 or a bool); an op rounds it only to the dtype
// it computes in, as PyTorch does, so a scalar never loses precision on its way into f64 math.
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "dtype.h"

namespace ember {

class Scalar {
 public:
  enum class Kind : uint8_t { kBoolean, kIntegral, kFloating };

  Scalar() : Scalar(int64_t{0}) {}
  template <typename T, std::enable_if_t<std::is_same_v<T, bool>, int> = 0>
  Scalar(T value) : kind_(Kind::kBoolean), i_(value ? 1 : 0), d_(value ? 1.0 : 0.0) {}  // NOLINT
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T value)
      : kind_(Kind::kIntegral),
        i_(static_cast<int64_t>(value)),
        d_(static_cast<double>(value)) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T value) : kind_(Kind::kFloating), i_(0), d_(static_cast<double>(value)) {}  // NOLINT
  Scalar(Half value) : Scalar(static_cast<float>(value)) {}                           // NOLINT
  Scalar(BFloat16 value) : Scalar(static_cast<float>(value)) {}                       // NOLINT

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::kFloating; }
  bool is_integral() const { return kind_ == Kind::kIntegral; }
  bool is_bool() const { return kind_ == Kind::kBoolean; }
  double to_double() const { return d_; }
  int64_t to_int() const { return kind_ == Kind::kFloating ? static_cast<int64_t>(d_) : i_; }
  bool to_bool() const { return kind_ == Kind::kFloating ? d_ != 0.0 : i_ != 0; }
  template <typename T>
  T to() const {
    if constexpr (std::is_same_v<T, bool>)
      return to_bool();
    else if constexpr (std::is_integral_v<T>)
      return static_cast<T>(to_int());
    else
      return static_cast<T>(d_);
  }
  // The dtype a lone scalar would have as a tensor: bool, i64 or f32 (PyTorch's defaults).
  DType default_dtype() const {
    return kind_ == Kind::kBoolean ? kBool : kind_ == Kind::kIntegral ? kI64 : kF32;
  }
  // The dtype that holds the value exactly: bool, i64 or f64 (how ops carry a scalar).
  DType exact_dtype() const {
    return kind_ == Kind::kBoolean ? kBool : kind_ == Kind::kIntegral ? kI64 : kF64;
  }

 private:
  Kind kind_;
  int64_t i_;
  double d_;
};

std::ostream& operator<<(std::ostream& out, const Scalar& s);

}  // namespace ember

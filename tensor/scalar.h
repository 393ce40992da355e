// A single number of any dtype, as ops that take a value (fill, add(x, 2.5), clamp) see it.
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "dtype.h"

namespace ember {

class Scalar {
 public:
  enum class Kind : uint8_t { kBool, kInt, kFloat };

  Scalar() : Scalar(int64_t{0}) {}
  template <typename T, std::enable_if_t<std::is_same_v<T, bool>, int> = 0>
  Scalar(T value) : kind_(Kind::kBool), i_(value ? 1 : 0), d_(value ? 1.0 : 0.0) {}  // NOLINT
  template <typename T,
            std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T value)
      : kind_(Kind::kInt),
        i_(static_cast<int64_t>(value)),
        d_(static_cast<double>(value)) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T value)
      : kind_(Kind::kFloat),
        i_(static_cast<int64_t>(value)),
        d_(static_cast<double>(value)) {}                        // NOLINT
  Scalar(Half value) : Scalar(static_cast<float>(value)) {}      // NOLINT
  Scalar(BFloat16 value) : Scalar(static_cast<float>(value)) {}  // NOLINT

  Kind kind() const { return kind_; }
  bool is_floating() const { return kind_ == Kind::kFloat; }
  bool is_integral() const { return kind_ == Kind::kInt; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  double to_double() const { return d_; }
  int64_t to_int() const { return kind_ == Kind::kFloat ? static_cast<int64_t>(d_) : i_; }
  bool to_bool() const { return kind_ == Kind::kFloat ? d_ != 0.0 : i_ != 0; }
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
    return kind_ == Kind::kBool ? kBool : kind_ == Kind::kInt ? kI64 : kF32;
  }

 private:
  Kind kind_;
  int64_t i_;
  double d_;
};

std::ostream& operator<<(std::ostream& out, const Scalar& s);

}  // namespace ember

// Element conversions of the CPU kernels (elementwise.cpp, random.cpp): between any two
// element types, through float for the 16-bit floats.
#pragma once

#include <type_traits>

#include "../dtype.h"

namespace ember::detail {

// Converts between any two element types (through float for the 16-bit floats).
template <typename To, typename From>
inline To convert(From value) {
  if constexpr (std::is_same_v<To, From>) {
    return value;
  } else if constexpr (std::is_same_v<To, bool>) {
    if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>)
      return static_cast<float>(value) != 0.0f;
    else
      return value != From(0);
  } else if constexpr (std::is_same_v<From, Half> || std::is_same_v<From, BFloat16>) {
    return convert<To>(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(value));
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace ember::detail

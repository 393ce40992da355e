// Element types, their sizes and names, PyTorch's type promotion, and the 16-bit floats.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string_view>

#if defined(__CUDACC__)
#define EMBER_HOST_DEVICE __host__ __device__
#else
#define EMBER_HOST_DEVICE
#endif

namespace ember {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kUInt8,
  kBool
};
inline constexpr int kNumDTypes = 8;

inline constexpr DType kF32 = DType::kFloat32;
inline constexpr DType kF64 = DType::kFloat64;
inline constexpr DType kF16 = DType::kFloat16;
inline constexpr DType kBF16 = DType::kBFloat16;
inline constexpr DType kI64 = DType::kInt64;
inline constexpr DType kI32 = DType::kInt32;
inline constexpr DType kU8 = DType::kUInt8;
inline constexpr DType kBool = DType::kBool;

namespace detail {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDA_ARCH__)
#define EMBER_HALF_F16C 1
// Whether this CPU converts between half and float in hardware: F16C, with the OS saving the
// AVX state its VEX encoding needs. Checked at run time, so one build runs everywhere.
inline bool detect_f16c() {
  unsigned eax = 1, ebx, ecx = 0, edx;
  __asm__("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
  constexpr unsigned kNeeded = (1u << 27) | (1u << 28) | (1u << 29);  // OSXSAVE, AVX, F16C
  if ((ecx & kNeeded) != kNeeded) return false;
  unsigned xcr0, high;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(high) : "c"(0));
  return (xcr0 & 6u) == 6u;  // XMM and YMM state enabled
}
// NOTE: zero (software conversion) until this initialiser has run, so a conversion made by
// another file's static initialiser is still right, only slower.
inline const bool kHalfF16C = detect_f16c();
#endif
// Whether Half's conversions on this CPU run in hardware (F16C); the answers are the same.
inline bool half_conversion_in_hardware() {
#if defined(EMBER_HALF_F16C)
  return kHalfF16C;
#else
  return false;
#endif
}
}  // namespace detail

// IEEE binary16, stored as bits; arithmetic happens in float. Conversions round to nearest
// even, keep subnormals, and turn every NaN into the quiet NaN 0x7e00 (sign kept); on the
// way back a NaN keeps its payload. On x86-64 CPUs with F16C they run in hardware
// (vcvtps2ph/vcvtph2ps, bit-identical: tested over every half and a dense set of floats).
struct Half {
  uint16_t bits = 0;
  Half() = default;
  EMBER_HOST_DEVICE Half(float value) : bits(from_float(value)) {}  // NOLINT: implicit like float
  EMBER_HOST_DEVICE operator float() const { return to_float(bits); }

  static EMBER_HOST_DEVICE uint16_t from_float(float value) {
#if defined(EMBER_HALF_F16C)
    if (detail::kHalfF16C) {
      uint64_t four;  // vcvtps2ph converts four lanes; the first is `value`, rounded to nearest
      __asm__("vcvtps2ph $0, %1, %0" : "=m"(four) : "x"(value));
      const auto h = static_cast<uint16_t>(four);
      // The hardware keeps a NaN's payload; ember makes every NaN 0x7e00 (sign kept).
      return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0
                 ? static_cast<uint16_t>((h & 0x8000u) | 0x7e00u)
                 : h;
    }
#endif
    return from_float_software(value);
  }
  static EMBER_HOST_DEVICE float to_float(uint16_t h) {
#if defined(EMBER_HALF_F16C)
    // inf and NaN by bits (the hardware would quiet a signalling NaN), the rest in hardware.
    if (detail::kHalfF16C && (h & 0x7c00u) != 0x7c00u) {
      const uint64_t four = h;
      float value;
      __asm__("vcvtph2ps %1, %0" : "=x"(value) : "m"(four));
      return value;
    }
#endif
    return to_float_software(h);
  }

  // The portable conversions: what a CPU without F16C and CUDA device code run.
  static EMBER_HOST_DEVICE uint16_t from_float_software(float value) {
    uint32_t x;
    memcpy(&x, &value, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u)
      return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow to inf
    if (x < 0x38800000u) {  // subnormal or zero in half: round to nearest even
      if (x < 0x33000000u) return static_cast<uint16_t>(sign);
      const uint32_t exponent = x >> 23;
      const uint32_t mantissa = (x & 0x7fffffu) | 0x800000u;
      const uint32_t shift = 126u - exponent;
      uint32_t half = mantissa >> shift;
      const uint32_t rest = mantissa & ((1u << shift) - 1u);
      const uint32_t halfway = 1u << (shift - 1u);
      if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
      return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = ((x - 0x38000000u) >> 13);
    const uint32_t rest = x & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  static EMBER_HOST_DEVICE float to_float_software(uint16_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu;
    uint32_t mantissa = h & 0x3ffu;
    uint32_t x;
    if (exponent == 0x1fu) {
      x = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent == 0) {
      if (mantissa == 0) {
        x = sign;
      } else {  // normalise the subnormal
        exponent = 113;
        while (!(mantissa & 0x400u)) {
          mantissa <<= 1;
          --exponent;
        }
        x = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
      }
    } else {
      x = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    }
    float value;
    memcpy(&value, &x, 4);
    return value;
  }
};

// bfloat16: the top half of a float, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  EMBER_HOST_DEVICE BFloat16(float value) : bits(from_float(value)) {}  // NOLINT
  EMBER_HOST_DEVICE operator float() const { return to_float(bits); }

  static EMBER_HOST_DEVICE uint16_t from_float(float value) {
    uint32_t x;
    memcpy(&x, &value, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
      return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
  }
  static EMBER_HOST_DEVICE float to_float(uint16_t b) {
    const uint32_t x = static_cast<uint32_t>(b) << 16;
    float value;
    memcpy(&value, &x, 4);
    return value;
  }
};

constexpr size_t element_size(DType t) {
  switch (t) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}
constexpr bool is_integral(DType t, bool include_bool = false) {
  return t == DType::kInt64 || t == DType::kInt32 || t == DType::kUInt8 ||
         (include_bool && t == DType::kBool);
}

// "f32", "i64", ... as ember prints them; "float32", ... are PyTorch's names.
std::string_view dtype_name(DType t);
std::string_view dtype_torch_name(DType t);
std::ostream& operator<<(std::ostream& out, DType t);

// PyTorch's promotion of two tensor dtypes (bool < integers < floats; f16 with bf16 gives f32).
DType promote_types(DType a, DType b);

// Maps a C++ element type to its DType: dtype_of<float> == kF32.
template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<Half> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};
template <typename T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace ember

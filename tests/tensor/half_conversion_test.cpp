// Half <-> float: the hardware conversion (F16C on x86-64, chosen at run time) gives exactly
// the portable conversion's bits, for every half and a dense set of floats that covers every
// rounding boundary of the half grid, subnormals, infinities and NaN payloads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include <ember/tensor/dtype.h>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace ember {
namespace {

uint32_t bits_of(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}
float float_of(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
TEST(HalfConversion, UsesF16CWhereTheCpuHasIt) {
  __builtin_cpu_init();
  EXPECT_EQ(detail::half_conversion_in_hardware(), __builtin_cpu_supports("f16c") != 0);
  if (!detail::half_conversion_in_hardware())
    GTEST_SKIP() << "no F16C: the portable conversion is the only one (tested as the reference)";
}
#endif

// Every one of the 65536 halves to float, and back.
TEST(HalfConversion, EveryHalfToFloatAndBack) {
  int64_t mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float value = Half::to_float(half);
    const uint32_t want = bits_of(Half::to_float_software(half));
    if (bits_of(value) != want && ++mismatches <= 5)
      ADD_FAILURE() << std::hex << "half 0x" << h << " -> float 0x" << bits_of(value)
                    << ", portable 0x" << want;
    // Every half is exact in float, so the trip back is the identity, NaNs aside (quieted).
    const uint16_t back = Half::from_float(value);
    const uint16_t back_want = Half::from_float_software(value);
    if (back != back_want && ++mismatches <= 5)
      ADD_FAILURE() << std::hex << "float 0x" << bits_of(value) << " -> half 0x" << back
                    << ", portable 0x" << back_want;
    if (!std::isnan(value)) {
      EXPECT_EQ(back, half) << std::hex << "half 0x" << h;
    }
  }
  EXPECT_EQ(mismatches, 0);
  // Spot values, as IEEE and PyTorch's torch.tensor(x).half() have them.
  EXPECT_EQ(Half::from_float(1.f), 0x3c00);
  EXPECT_EQ(Half::from_float(65504.f), 0x7bff);
  EXPECT_EQ(Half::from_float(65520.f), 0x7c00);  // the first float that rounds to inf
  EXPECT_EQ(Half::from_float(65519.996f), 0x7bff);
  EXPECT_EQ(Half::from_float(std::ldexp(1.f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(Half::from_float(std::ldexp(1.f, -25)), 0x0000);  // a tie: to even (zero)
  EXPECT_EQ(Half::from_float(std::ldexp(3.f, -25)), 0x0002);  // a tie: to even (2)
  EXPECT_EQ(Half::from_float(-0.f), 0x8000);
  EXPECT_EQ(Half::from_float(-std::numeric_limits<float>::quiet_NaN()), 0xfe00);
  EXPECT_EQ(Half::from_float(float_of(0x7fa00000u)), 0x7e00);  // a signalling NaN, quieted
  EXPECT_EQ(bits_of(Half::to_float(0x7c01)), 0x7f802000u);     // payload kept on the way back
  EXPECT_EQ(Half::to_float(0x0001), std::ldexp(1.f, -24));
}

// Floats: a stride through all 2^32 bit patterns, and around every boundary between two
// adjacent halves (the exact midpoint and its float neighbours), where rounding decides.
TEST(HalfConversion, DenseFloatsRoundAsThePortableConversion) {
  int64_t mismatches = 0, checked = 0;
  auto check = [&](uint32_t x) {
    const float f = float_of(x);
    const uint16_t got = Half::from_float(f), want = Half::from_float_software(f);
    ++checked;
    if (got != want && ++mismatches <= 5)
      ADD_FAILURE() << std::hex << "float 0x" << x << " -> half 0x" << got << ", portable 0x"
                    << want;
  };
  for (uint64_t x = 0; x < (uint64_t{1} << 32); x += 1021) check(static_cast<uint32_t>(x));
  for (uint32_t x = 0; x < (1u << 20); ++x) {  // float subnormals and the smallest normals
    check(x);
    check(x | 0x80000000u);
  }
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t h = 0; h < 0x7c00; ++h) {  // finite halves h and h + 1 (0x7c00: inf)
      const double lo = Half::to_float_software(static_cast<uint16_t>(h));
      const double hi =
          h + 1 == 0x7c00 ? 65520.0 : Half::to_float_software(static_cast<uint16_t>(h + 1));
      const uint32_t mid = bits_of(static_cast<float>((lo + hi) / 2));  // exact in float
      for (uint32_t d = 0; d < 5; ++d) check(((mid - 2 + d) & 0x7fffffffu) | (sign << 31));
    }
  }
  for (uint32_t payload = 1; payload < (1u << 23); payload += 4093) {  // NaNs of many payloads
    check(0x7f800000u | payload);
    check(0xff800000u | payload);
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
}

#if defined(__x86_64__)
// A program that sets flush-to-zero and denormals-are-zero (as some do for speed) still gets
// half subnormals both ways: the hardware conversion ignores both, as the portable one does.
TEST(HalfConversion, SubnormalsUnderFlushToZero) {
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
  int64_t mismatches = 0;
  for (uint32_t h = 1; h < 0x400; ++h) {
    const auto half = static_cast<uint16_t>(h);
    mismatches += bits_of(Half::to_float(half)) != bits_of(Half::to_float_software(half));
    mismatches += Half::from_float(Half::to_float_software(half)) != half;
  }
  _mm_setcsr(csr);
  EXPECT_EQ(mismatches, 0);
}
#endif

}  // namespace
}  // namespace ember

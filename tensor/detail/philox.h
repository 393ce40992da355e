// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"), shared by
// the CPU and CUDA kernels so both produce identical bits for the same (seed, offset, i).
#pragma once

#include <math.h>

#include <cstdint>

#include "../dtype.h"

namespace ember::detail {

struct PhiloxOutput {
  uint32_t x[4];
};

EMBER_HOST_DEVICE inline void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

// Four 32-bit words for element `index` of the draw (seed, offset).
EMBER_HOST_DEVICE inline PhiloxOutput philox(uint64_t seed, uint64_t offset, uint64_t index) {
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(offset), c3 = static_cast<uint32_t>(offset >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, hi0, lo0);
    philox_mulhilo(0xCD9E8D57u, c2, hi1, lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return PhiloxOutput{{c0, c1, c2, c3}};
}

// Uniform in [0, 1) with 24 random bits (exactly representable in float).
EMBER_HOST_DEVICE inline float philox_uniform(uint32_t bits) {
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}
// Uniform in [0, 1) with 53 random bits, for f64 draws.
EMBER_HOST_DEVICE inline double philox_uniform_double(uint32_t hi, uint32_t lo) {
  const uint64_t bits = (static_cast<uint64_t>(hi) << 21) ^ (lo >> 11);
  return static_cast<double>(bits & ((1ull << 53) - 1)) * (1.0 / 9007199254740992.0);
}

// The draws of kernel_table.h's RandomKind, element by element. Float dtypes (f32, f16, bf16)
// compute in float, f64 in double; the CPU and CUDA kernels both call these.
EMBER_HOST_DEVICE inline float random_uniform_float(uint64_t seed, uint64_t offset, uint64_t index,
                                                    float low, float high) {
  const PhiloxOutput r = philox(seed, offset, index);
  const float value = low + (high - low) * philox_uniform(r.x[0]);
  return value < high ? value : low;  // rounding may reach `high`; the interval is half-open
}
EMBER_HOST_DEVICE inline double random_uniform_double(uint64_t seed, uint64_t offset,
                                                      uint64_t index, double low, double high) {
  const PhiloxOutput r = philox(seed, offset, index);
  const double value = low + (high - low) * philox_uniform_double(r.x[0], r.x[1]);
  return value < high ? value : low;
}
// Box-Muller on two uniforms; 1 - u keeps the logarithm's argument in (0, 1].
EMBER_HOST_DEVICE inline float random_normal_float(uint64_t seed, uint64_t offset, uint64_t index,
                                                   float mean, float stddev) {
  const PhiloxOutput r = philox(seed, offset, index);
  const float u1 = 1.0f - philox_uniform(r.x[0]);
  const float u2 = philox_uniform(r.x[1]);
  return mean + stddev * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
}
EMBER_HOST_DEVICE inline double random_normal_double(uint64_t seed, uint64_t offset, uint64_t index,
                                                     double mean, double stddev) {
  const PhiloxOutput r = philox(seed, offset, index);
  const double u1 = 1.0 - philox_uniform_double(r.x[0], r.x[1]);
  const double u2 = philox_uniform_double(r.x[2], r.x[3]);
  return mean + stddev * sqrt(-2.0 * log(u1)) * cos(6.283185307179586476925 * u2);
}
// Uniform integer in [low, low + range), range >= 1, from 64 random bits.
EMBER_HOST_DEVICE inline int64_t random_int(uint64_t seed, uint64_t offset, uint64_t index,
                                            int64_t low, uint64_t range) {
  const PhiloxOutput r = philox(seed, offset, index);
  const uint64_t bits = (static_cast<uint64_t>(r.x[1]) << 32) | r.x[0];
  return low + static_cast<int64_t>(bits % range);
}

}  // namespace ember::detail

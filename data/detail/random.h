// Key derivation shared by the data module's random draws (private).
#pragma once

#include <cstdint>

namespace ember::data::detail {

// SplitMix64's finaliser: spreads a seed's bits so that nearby seeds give unrelated keys.
inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Salts that keep the sampler's and the transforms' Philox streams apart for one seed.
inline constexpr uint64_t kSamplerSalt = 0x73616d706c657221ull;
inline constexpr uint64_t kTransformSalt = 0x7472616e73666f72ull;
// The random-window draws (random_window_starts).
inline constexpr uint64_t kWindowSalt = 0x77696e646f777321ull;

}  // namespace ember::data::detail

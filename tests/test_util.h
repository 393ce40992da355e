// Helpers shared by ember's tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include <ember/ember.h>

namespace ember::testing {

// Checks shape, dtype and every value of `actual` against `expected` (any device), within
// |a - e| <= atol + rtol * |e|; NaNs must match NaNs.
inline void expect_close(const Tensor& actual, const Tensor& expected, double rtol = 1e-5,
                         double atol = 1e-7) {
  ASSERT_EQ(actual.sizes(), expected.sizes())
      << "shape " << shape_str(actual.sizes()) << " vs " << shape_str(expected.sizes());
  ASSERT_EQ(actual.dtype(), expected.dtype());
  const auto a = actual.to_vector<double>();
  const auto e = expected.to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(e[i])) {
      EXPECT_TRUE(std::isnan(a[i])) << "at flat index " << i;
      continue;
    }
    if (std::isinf(e[i])) {
      EXPECT_EQ(a[i], e[i]) << "at flat index " << i;
      continue;
    }
    EXPECT_LE(std::abs(a[i] - e[i]), atol + rtol * std::abs(e[i]))
        << "at flat index " << i << ": " << a[i] << " vs " << e[i];
  }
}

// Expects `statement` to throw ember::Error whose message contains `fragment`.
#define EXPECT_EMBER_ERROR(statement, fragment)                                     \
  do {                                                                              \
    try {                                                                           \
      statement;                                                                    \
      ADD_FAILURE() << "expected ember::Error containing \"" << (fragment) << "\""; \
    } catch (const ::ember::Error& e) {                                             \
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)            \
          << "message was: " << e.what();                                           \
    }                                                                               \
  } while (0)

// Skips the current test where no CUDA device is visible.
#define EMBER_REQUIRE_CUDA()                                                      \
  do {                                                                            \
    if (!::ember::cuda::is_available()) GTEST_SKIP() << "no CUDA device visible"; \
  } while (0)

}  // namespace ember::testing

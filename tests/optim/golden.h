// PyTorch's reference values for the optim tests (written by golden/make_optim_golden.py).
#pragma once

#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ember::testing {

// The parsed JSON file at `path` (a failed expectation when it cannot be opened).
inline nlohmann::json read_golden(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return nlohmann::json::parse(in);
}

inline const nlohmann::json& optim_golden() {
  static const nlohmann::json golden = read_golden(EMBER_OPTIM_GOLDEN);
  return golden;
}

// |actual - expected| <= atol + rtol * |expected| for every element.
inline void expect_values_near(const std::vector<double>& actual,
                               const std::vector<double>& expected, double rtol, double atol,
                               const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_LE(std::abs(actual[i] - expected[i]), atol + rtol * std::abs(expected[i]))
        << what << " at " << i << ": " << actual[i] << " vs " << expected[i];
  }
}

}  // namespace ember::testing

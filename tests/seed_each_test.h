// Seeds ember's default generator with 0 before every test of a test binary.
//
// The default generator starts from a fresh random seed in each process, as PyTorch's does;
// ember's tests want the same numbers on every run and whatever tests a filter selects, so
// each test starts from manual_seed(0), as a PyTorch test suite's setUp seeds torch. Tests of
// the unseeded behaviour itself run their draws in a separate process (random_draws_main.cpp).
#pragma once

#include <gtest/gtest.h>

#include <ember/tensor/random.h>

namespace ember::testing {

class SeedEachTest : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo& /*test*/) override { manual_seed(0); }
};

// Appends the listener to the running binary's listeners (call after InitGoogleTest).
inline void seed_each_test() {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SeedEachTest);
}

}  // namespace ember::testing

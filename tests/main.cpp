// The main of every test binary without one of its own: GoogleTest's, with each test started
// from manual_seed(0) (seed_each_test.h).
#include <gtest/gtest.h>

#include "seed_each_test.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ember::testing::seed_each_test();
  return RUN_ALL_TESTS();
}

// Where a test finds a file it reads or a program it runs (tests/CMakeLists.txt's
// ember_test_file definitions expand to test_file calls; the build force-includes this header
// where it sets one).
#pragma once

#include <cstdlib>
#include <string>

namespace ember::testing {

// `relative` under the folder the environment variable `root` names when it is set (a moved
// copy of the tests, as scripts/gpu_session.sh runs them: the golden data under
// EMBER_TEST_DATA_DIR, ember-train and ember-run under EMBER_TEST_BIN_DIR), else under
// `built_in`, the folder CMake knew.
inline std::string test_file(const char* root, const char* built_in, const char* relative) {
  const char* given = std::getenv(root);
  return std::string(given != nullptr && *given != '\0' ? given : built_in) + "/" + relative;
}

}  // namespace ember::testing

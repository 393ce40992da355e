#!/usr/bin/env bash
# ember's one test command: installs what is missing, builds (scripts/setup.sh), then runs
# every test with CTest. Exits non-zero when the build or any test fails.
#
# Environment: as scripts/setup.sh, plus
#   EMBER_TEST_JOBS     tests run in parallel (default: 2)
#   EMBER_TEST_TIMEOUT  seconds one test may take (default: 900)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/setup.sh"

build_dir="${EMBER_BUILD_DIR:-build}"
[[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"
ctest --test-dir "$build_dir" --output-on-failure --no-tests=error \
  -j "${EMBER_TEST_JOBS:-2}" --timeout "${EMBER_TEST_TIMEOUT:-900}"

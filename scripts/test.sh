#!/usr/bin/env bash
# ember's one test command: installs what is missing, builds (scripts/setup.sh), then runs
# every test with CTest. Exits non-zero when the build or any test fails.
#
#   bash scripts/test.sh              the build in build/ and every test (what CI runs)
#   bash scripts/test.sh --sanitize   AddressSanitizer + UndefinedBehaviorSanitizer: builds
#       ember CPU-only with -DEMBER_SANITIZE=ON into build-sanitize/ and runs the suite there
#       (memory errors, undefined behaviour and leaks in ember fail the test that meets them;
#       leaks in Open MPI's own libraries are suppressed by scripts/sanitize/lsan.supp), then
#       the libFuzzer harnesses for 60 s each when tests/data/fuzz/run.sh exists.
#
# Environment: as scripts/setup.sh, plus
#   EMBER_TEST_JOBS           tests run in parallel (default: 2)
#   EMBER_TEST_TIMEOUT        seconds one test may take (default: 900)
#   EMBER_SANITIZE_BUILD_DIR  build folder of --sanitize (default: build-sanitize)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sanitize=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    -h | --help)
      sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "test.sh: unknown argument '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

if ((!sanitize)); then
  bash "$repo_root/scripts/setup.sh"
  build_dir="${EMBER_BUILD_DIR:-build}"
  [[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"
  ctest --test-dir "$build_dir" --output-on-failure --no-tests=error \
    -j "${EMBER_TEST_JOBS:-2}" --timeout "${EMBER_TEST_TIMEOUT:-900}"
  bash "$repo_root/scripts/check_emulated_coverage.sh" "$build_dir"
  exit 0
fi

# --sanitize: its own build folder, so the instrumented objects never mix with build/'s (and
# ccache keeps both). -O1 -g: stacks with lines, and ember's own loops fast enough for the
# tests' time limits (at -O0 ember-train's steps take some 20x longer). nvcc-built code cannot
# be instrumented, so CUDA is off. No -Werror: GCC's warnings under -fsanitize include false
# positives; the plain build checks the warnings.
bash "$repo_root/scripts/setup.sh" --deps-only
build_dir="${EMBER_SANITIZE_BUILD_DIR:-build-sanitize}"
[[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"
cmake_args=(-S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g" -DEMBER_CUDA=OFF -DEMBER_SANITIZE=ON
  -DEMBER_BUILD_BENCH=OFF -DEMBER_WARNINGS_AS_ERRORS=OFF)
[[ -f "$build_dir/CMakeCache.txt" ]] || cmake_args+=(-G Ninja)
cmake "${cmake_args[@]}"
cmake --build "$build_dir" --parallel "${EMBER_JOBS:-$(nproc)}"

# The first error ends the program with its stack; UBSan's too (-fno-sanitize-recover at
# compile time). LeakSanitizer runs at every exit; its suppressions name only Open MPI's own
# libraries (see the file), so a leak in ember's code still fails.
asan_options="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export LSAN_OPTIONS="suppressions=$repo_root/scripts/sanitize/lsan.supp:print_suppressions=0"
# mpirun starts local ranks with its own environment; name the variables anyway (mpirun -x
# as an MCA parameter) so they reach every rank however it is launched.
export OMPI_MCA_mca_base_env_list="ASAN_OPTIONS;UBSAN_OPTIONS;LSAN_OPTIONS"
ctest_args=(--test-dir "$build_dir" --output-on-failure -j "${EMBER_TEST_JOBS:-2}"
  --timeout "${EMBER_TEST_TIMEOUT:-900}")
status=0
# A report also fails the run where the test itself passed: the jobs that must fail (dist's
# expect_failure.sh) and skipped tests would otherwise hide one. CTest keeps every test's
# output in LastTest.log.
check_reports() {
  local log="$build_dir/Testing/Temporary/LastTest.log"
  if grep -Eq 'ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log"; then
    echo "test.sh: sanitizer reports in $1 (tests passing or not); from $log:" >&2
    grep -E '^[0-9]+/[0-9]+ Test:|ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:' "$log" |
      grep -B1 -E 'ERROR|runtime error' >&2
    status=1
  fi
}

# Left out of this run, by CTest label:
#   install  tests/install/ builds programs out of tree against the installed ember (and the
#            .deb packages) with the user's own flags, without -fsanitize: an uninstrumented
#            program cannot load ASan-instrumented libraries ("ASan runtime does not come
#            first"). What they check is packaging, not ember's memory use; build/ runs them.
# Two passes. Everything that starts no MPI: ASan's fast frame-pointer unwinder.
ASAN_OPTIONS="$asan_options" ctest "${ctest_args[@]}" --no-tests=error \
  -LE '^(install|dist|mpi)$' || status=1
check_reports "the tests without MPI"
# dist and mpi (every process in them starts MPI): fast_unwind_on_malloc=0 unwinds through
# Open MPI, which has no frame pointers, so its leaks show the library they come from and the
# suppressions can match them; slower, so only here.
ASAN_OPTIONS="$asan_options:fast_unwind_on_malloc=0" ctest "${ctest_args[@]}" \
  --no-tests=ignore -L '^(dist|mpi)$' -LE '^install$' || status=1
check_reports "the dist and MPI tests"

if [[ -f "$repo_root/tests/data/fuzz/run.sh" ]]; then
  bash "$repo_root/tests/data/fuzz/run.sh" "$build_dir/fuzz" 60 || status=1
fi
exit "$status"

#!/usr/bin/env bash
# Installs the Debian packages ember needs (only when some are missing), then configures
# and builds ember with CMake and Ninja. Each phase says what it does and how long it took.
#
#   bash scripts/setup.sh               everything (what scripts/test.sh and CI build): every
#                                       package, and all targets (tests and benchmarks too)
#                                       in build/, the CUDA backend compiled (EMBER_CUDA=ON)
#   bash scripts/setup.sh --train       training only (what scripts/train.sh builds): the
#                                       packages ember-train needs, and ember-train with the
#                                       libraries it links in build-train/, the CUDA backend
#                                       compiled only where a GPU is visible (EMBER_CUDA=AUTO)
#   bash scripts/setup.sh --deps-only   install the packages and stop (with --train, training's)
#
# Environment:
#   CI=true or EMBER_WERROR=1  build with warnings as errors (-DEMBER_WARNINGS_AS_ERRORS=ON)
#   EMBER_BUILD_DIR            build folder of everything (default: build)
#   EMBER_TRAIN_BUILD_DIR      build folder of --train (default: build-train)
#   EMBER_BUILD_TYPE           CMake build type (default: Release)
#   EMBER_CMAKE_ARGS           extra CMake arguments (they come last and win), e.g.
#                              "-DEMBER_CUDA=OFF" or "-DEMBER_CUDNN_ROOT=... -DEMBER_NCCL_ROOT=..."
#   EMBER_JOBS                 parallel build jobs (default: number of cores)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/phase.sh
source "$repo_root/scripts/phase.sh"
# shellcheck source=scripts/debian_packages.sh
source "$repo_root/scripts/debian_packages.sh"
deps_only=0
train=0
for arg in "$@"; do
  case "$arg" in
    --deps-only) deps_only=1 ;;
    --train) train=1 ;;
    -h | --help)
      sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup.sh: unknown argument '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

# What ember-train needs to build and run: the build tools, OpenBLAS and oneDNN, Open MPI,
# zlib, libpng and libjpeg (image decoding), OpenSSL's libcrypto (HMAC-SHA256 for the job
# secret, EMBER_JOB_SECRET), nlohmann-json, CLI11, the Fashion-MNIST data set (ember-train's
# default) and gnuplot (its curves.png). OpenMP comes with GCC (libgomp, part of
# build-essential).
train_packages=(
  build-essential cmake ninja-build ccache
  libopenblas-dev libdnnl-dev
  libopenmpi-dev openmpi-bin
  zlib1g-dev libpng-dev libjpeg62-turbo-dev libssl-dev
  nlohmann-json3-dev libcli11-dev
  dataset-fashion-mnist
  gnuplot-nox
)
# What the tests need besides: GoogleTest/GoogleMock, git and pkg-config (the install
# tests), clang-format, clang with its libFuzzer and sanitizer runtimes (libclang-rt-14-dev, for
# tests/data/fuzz/run.sh), iproute2 (the two-host test's network namespaces). Slurm and munge
# are for the srun test (tests/dist/slurm.sh), which starts its own daemons; srun --mpi=pmix
# loads libpmix.so from libpmix-dev. dpkg-dev (dpkg-shlibdeps), file and lintian build and
# check the Debian packages (cpack -G DEB; tests/install/deb_test.sh). fortunes is ember's
# default text corpus (/usr/share/games/fortunes) for the GPT data tests. python3 reads gcov's
# JSON for the emulated-CUDA coverage check and the GPU bundle's manifest (gcov comes with gcc).
# procps (pgrep) lets the launcher tests find the workers a launcher left behind.
test_packages=(
  git pkg-config python3
  libgtest-dev libgmock-dev googletest
  clang libclang-rt-14-dev
  clang-format
  iproute2
  slurmd slurmctld slurm-client munge libpmix-dev
  dpkg-dev file lintian
  fortunes
  procps
)
packages=("${train_packages[@]}")
which="ember's"
if ((train)); then
  which="training's"
else
  packages+=("${test_packages[@]}")
fi

phase packages "checking $which ${#packages[@]} Debian packages"
install_missing_packages setup.sh "${packages[@]}"
if ((${#missing_packages[@]} > 0)); then
  phase_done "${#missing_packages[@]} installed"
else
  phase_done "all already installed"
fi

((deps_only)) && exit 0

if ((train)); then
  build_dir="${EMBER_TRAIN_BUILD_DIR:-build-train}"
  # Its own folder: no tests or benchmarks (and so no GoogleTest), and CUDA only where a GPU
  # is visible, where build/ always compiles it; each keeps its objects, so neither command
  # rebuilds the other's.
  cmake_args=(-DEMBER_BUILD_TESTS=OFF -DEMBER_BUILD_BENCH=OFF -DEMBER_CUDA=AUTO)
  targets=(--target ember-train)
  what="ember-train and the libraries it links"
else
  build_dir="${EMBER_BUILD_DIR:-build}"
  cmake_args=(-DEMBER_CUDA=ON)
  targets=()
  what="every target"
fi
[[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"
cmake_args=(-S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-Release}"
  "${cmake_args[@]}")
# Ninja for a new build folder; an existing one keeps the generator it was made with.
[[ -f "$build_dir/CMakeCache.txt" ]] || cmake_args+=(-G Ninja)
if [[ "${CI:-}" == "true" || "${EMBER_WERROR:-0}" == "1" ]]; then
  cmake_args+=(-DEMBER_WARNINGS_AS_ERRORS=ON)
fi
if [[ -n "${EMBER_CMAKE_ARGS:-}" ]]; then
  read -r -a extra <<<"$EMBER_CMAKE_ARGS"
  cmake_args+=("${extra[@]}")
fi

phase configure "cmake ${cmake_args[*]}"
cmake "${cmake_args[@]}"
phase_done

phase build "$what in ${build_dir#"$repo_root/"}/"
# Ninja numbers the steps it runs ([done/total]): the last one's first number is the count.
log="$build_dir/setup-build.log"
cmake --build "$build_dir" "${targets[@]}" --parallel "${EMBER_JOBS:-$(nproc)}" | tee "$log"
built="$(grep -Eo '^\[[0-9]+/' "$log" | tail -1 | tr -d '[/')"
phase_done "${built:+$built targets built}"

#!/usr/bin/env bash
# Installs the Debian packages ember needs (only when some are missing), then configures
# and builds ember into build/ with CMake and Ninja.
#
#   bash scripts/setup.sh               install, configure, build
#   bash scripts/setup.sh --deps-only   install the packages and stop
#
# Environment:
#   CI=true or EMBER_WERROR=1  build with warnings as errors (-DEMBER_WARNINGS_AS_ERRORS=ON)
#   EMBER_BUILD_DIR            build folder (default: build)
#   EMBER_BUILD_TYPE           CMake build type (default: Release)
#   EMBER_CMAKE_ARGS           extra CMake arguments, e.g.
#                              "-DEMBER_CUDA=OFF" or "-DEMBER_CUDNN_ROOT=... -DEMBER_NCCL_ROOT=..."
#   EMBER_JOBS                 parallel build jobs (default: number of cores)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps_only=0
for arg in "$@"; do
  case "$arg" in
    --deps-only) deps_only=1 ;;
    -h | --help)
      sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup.sh: unknown argument '$arg' (try --help)" >&2
      exit 2
      ;;
  esac
done

# Build tools, OpenBLAS and oneDNN, GoogleTest/GoogleMock, Open MPI, zlib,
# libpng and libjpeg (image decoding), nlohmann-json, CLI11, clang-format, clang with its
# libFuzzer and sanitizer runtimes (libclang-rt-14-dev, for tests/data/fuzz/run.sh), and the
# Fashion-MNIST data set the data tests read.
# OpenMP comes with GCC (libgomp, part of build-essential). Slurm and munge are for the srun
# test (tests/dist/slurm.sh), which starts its own daemons; srun --mpi=pmix loads libpmix.so
# from libpmix-dev. dpkg-dev (dpkg-shlibdeps), file and lintian build and check the Debian
# packages (cpack -G DEB; tests/install/deb_test.sh).
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libopenblas-dev libdnnl-dev
  libgtest-dev libgmock-dev googletest
  libopenmpi-dev openmpi-bin
  zlib1g-dev nlohmann-json3-dev libcli11-dev
  libpng-dev libjpeg62-turbo-dev
  libssl-dev  # OpenSSL's libcrypto: HMAC-SHA256 for the job secret (EMBER_JOB_SECRET)
  clang libclang-rt-14-dev
  clang-format
  dataset-fashion-mnist
  gnuplot-nox
  iproute2
  slurmd slurmctld slurm-client munge libpmix-dev
  dpkg-dev file lintian
  fortunes  # ember's default text corpus (/usr/share/games/fortunes) for the GPT data tests
)

missing=()
for pkg in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == "installed" ]] || missing+=("$pkg")
done

if ((${#missing[@]} > 0)); then
  echo "setup.sh: installing ${missing[*]}"
  as_root=()
  if [[ "$(id -u)" != 0 ]]; then
    if ! command -v sudo >/dev/null; then
      echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2
      exit 1
    fi
    as_root=(sudo)
  fi
  "${as_root[@]}" apt-get update
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup.sh: all ${#packages[@]} Debian packages already installed"
fi

((deps_only)) && exit 0

build_dir="${EMBER_BUILD_DIR:-build}"
[[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"
cmake_args=(-S "$repo_root" -B "$build_dir" -DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-Release}")
# Ninja for a new build folder; an existing one keeps the generator it was made with.
[[ -f "$build_dir/CMakeCache.txt" ]] || cmake_args+=(-G Ninja)
if [[ "${CI:-}" == "true" || "${EMBER_WERROR:-0}" == "1" ]]; then
  cmake_args+=(-DEMBER_WARNINGS_AS_ERRORS=ON)
fi
if [[ -n "${EMBER_CMAKE_ARGS:-}" ]]; then
  read -r -a extra <<<"$EMBER_CMAKE_ARGS"
  cmake_args+=("${extra[@]}")
fi

echo "setup.sh: cmake ${cmake_args[*]}"
cmake "${cmake_args[@]}"
cmake --build "$build_dir" --parallel "${EMBER_JOBS:-$(nproc)}"

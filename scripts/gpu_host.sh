#!/usr/bin/env bash
# Builds and tests ember on a GPU machine that has CUDA, CMake and ninja but no package
# registry and no Debian packages of ember's own dependencies: cuDNN and NCCL come from the
# Python wheels (site-packages/nvidia/{cudnn,nccl}), everything else from Debian .deb files
# fetched beforehand on a machine with apt and unpacked here with dpkg -x (no root install).
#
#   bash scripts/gpu_host.sh fetch DIR       on a Debian machine: download the .deb files into DIR
#   bash scripts/gpu_host.sh fetch-runtime DIR   the runtime packages alone (no headers, no
#                                            build tools), from apt's cache where it holds
#                                            them, else downloaded (gpu_session.sh pack)
#   bash scripts/gpu_host.sh fetch-data DIR  on a Debian machine: the dataset-fashion-mnist .deb
#                                            (31 MB; a call of its own, see gpu_session.sh e2e)
#   source scripts/gpu_host.sh env DIR       on the GPU machine: unpack DIR and set the paths
#   bash scripts/gpu_host.sh build DIR       on the GPU machine: env, then configure, build and
#                                            run the whole test suite in build-gpu/
#   bash scripts/gpu_host.sh bench DIR       on the GPU machine, after build: the GPU benchmarks
#                                            (README's H100 table), PyTorch beside them
#
# Environment for build: EMBER_BUILD_DIR (default build-gpu), EMBER_JOBS (default nproc),
# EMBER_CUDA_ARCHITECTURES (default 90, the H100/H200). For env: EMBER_DEB_ROOT, the folder
# the .deb files are unpacked into (default /tmp/ember-debroot).
# Sourced with no command, this file only defines its functions and package lists.

# Runtime libraries of ember, its tests and Open MPI (with what Open MPI's plugins load), then
# the headers, CMake packages and pkg-config the build needs.
gpu_host_runtime_packages=(
  openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 libevent-core-2.1-7
  libevent-pthreads-2.1-7 libfabric1 libucx0 libpsm2-2 libpsm-infinipath1 libnuma1
  libibverbs1 ibverbs-providers librdmacm1 libnl-3-200 libnl-route-3-200 libmunge2
  libatomic1 libuuid1 libudev1 zlib1g
  libopenblas0-pthread libgfortran5 libquadmath0 libgomp1 libdnnl2 ocl-icd-libopencl1
  libpng16-16 libjpeg62-turbo libssl3
)
gpu_host_build_packages=(
  libopenblas-dev libopenblas-pthread-dev libdnnl-dev libgtest-dev libgmock-dev
  libopenmpi-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libpng-dev libjpeg62-turbo-dev libssl-dev
  pkgconf pkgconf-bin libpkgconf3
)

gpu_host_fetch() {
  local dir="$1"
  mkdir -p "$dir"
  (cd "$dir" && apt-get download "${gpu_host_runtime_packages[@]}" "${gpu_host_build_packages[@]}")
}

# The runtime packages alone: each from apt's cache (/var/cache/apt/archives, its newest
# version there) when it is there, the others downloaded.
gpu_host_fetch_runtime() {
  local dir="$1" pkg cached missing=()
  mkdir -p "$dir"
  for pkg in "${gpu_host_runtime_packages[@]}"; do
    cached="$(ls -v /var/cache/apt/archives/"${pkg}"_*.deb 2>/dev/null | tail -1)"
    if [ -n "$cached" ]; then cp "$cached" "$dir/"; else missing+=("$pkg"); fi
  done
  if [ ${#missing[@]} -gt 0 ]; then
    (cd "$dir" && apt-get download "${missing[@]}")
  fi
}

# The data the e2e stage of gpu_session.sh trains on, in a folder of its own.
gpu_host_fetch_data() {
  local dir="$1"
  mkdir -p "$dir"
  (cd "$dir" && apt-get download dataset-fashion-mnist)
}
# Unpacks the .deb files into a private root and points the compiler, CMake, the loader and
# Open MPI at it, and at the wheels' CUDA libraries.
gpu_host_env() {
  local dir="$1"
  export EMBER_DEB_ROOT="${EMBER_DEB_ROOT:-/tmp/ember-debroot}"
  # Unpacked once per set of .deb files: the stamp names the folder and its files.
  local stamp
  stamp="$(cd "$dir" && pwd && printf '%s\n' *.deb)" || return 1
  if [ "$(cat "$EMBER_DEB_ROOT/.unpacked-from" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$EMBER_DEB_ROOT"
    mkdir -p "$EMBER_DEB_ROOT"
    for deb in "$dir"/*.deb; do dpkg -x "$deb" "$EMBER_DEB_ROOT" || return 1; done
    # Absolute links (libz.so -> /lib/.../libz.so.1.2.13) point into the private root.
    local link target
    find "$EMBER_DEB_ROOT" -type l | while read -r link; do
      target="$(readlink "$link")"
      if [[ "$target" == /* ]]; then ln -sfn "$EMBER_DEB_ROOT$target" "$link"; fi
    done
    # What update-alternatives would link (PSM's library, which libfabric and Open MPI's ofi and
    # psm plugins need), dpkg -x does not.
    ln -sfn ../../lib/libpsm1/libpsm_infinipath.so.1.16 \
      "$EMBER_DEB_ROOT/usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1"
    printf '%s\n' "$stamp" >"$EMBER_DEB_ROOT/.unpacked-from"
  fi
  local r="$EMBER_DEB_ROOT" multiarch=x86_64-linux-gnu
  # The wheels' cuDNN and NCCL, when this python has them (else the toolkit's own); the
  # wheels' other libraries (cuBLAS, the runtime) are left to the toolkit ember builds with.
  local site wheel_libs=""
  site="$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null || true)"
  # Each only where that wheel is installed: a root given without its files stops configure.
  if [ -n "$site" ] && [ -f "$site/nvidia/cudnn/include/cudnn.h" ]; then
    export EMBER_CUDNN_ROOT="$site/nvidia/cudnn"
    wheel_libs="$EMBER_CUDNN_ROOT/lib:"
  fi
  if [ -n "$site" ] && [ -f "$site/nvidia/nccl/include/nccl.h" ]; then
    export EMBER_NCCL_ROOT="$site/nvidia/nccl"
    wheel_libs="$wheel_libs$EMBER_NCCL_ROOT/lib:"
  fi
  # A wheel without headers (a runtime-only layout) still lends its library to the loader.
  local lib folder
  for lib in libcudnn.so.9 libnccl.so.2; do
    [ -n "$site" ] || break
    lib="$(find "$site/nvidia" -name "$lib" 2>/dev/null | head -1)"
    folder="$(dirname "${lib:-.}")"
    if [ -n "$lib" ] && [[ ":$wheel_libs" != *":$folder:"* ]]; then wheel_libs="$wheel_libs$folder:"; fi
  done
  # UCX's transports find each other through their absolute RUNPATH (/usr/lib/.../ucx), which
  # the loader's path overrides.
  export LD_LIBRARY_PATH="$r/usr/lib/$multiarch:$r/lib/$multiarch:$r/usr/lib/$multiarch/openblas-pthread:$r/usr/lib/$multiarch/openmpi/lib:$r/usr/lib/$multiarch/ucx:${wheel_libs}/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LIBRARY_PATH="$r/usr/lib/$multiarch:$r/lib/$multiarch"
  export CMAKE_PREFIX_PATH="$r/usr"
  export PKG_CONFIG_PATH="$r/usr/lib/$multiarch/pkgconfig:$r/usr/share/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$r"
  # Open MPI finds its plugins, help texts and orted under OPAL_PREFIX; Debian installs it
  # under the names mpirun/mpicxx through alternatives, which dpkg -x does not set up.
  export OPAL_PREFIX="$r/usr"
  # PMIx does not read OPAL_PREFIX: it is told where it lives and where its plugins are (the
  # ranks' PMIx client reads the prefix alone).
  export PMIX_INSTALL_PREFIX="$r/usr/lib/$multiarch/pmix2"
  export PMIX_MCA_mca_base_component_path="$r/usr/lib/$multiarch/pmix2/lib/pmix"
  export PATH="$r/usr/bin:$PATH"
  export OMPI_MCA_btl=self,vader OMPI_MCA_pml=ob1 PMIX_MCA_pcompress_base_silence_warning=1
  ln -sf orterun "$r/usr/bin/mpirun"
  ln -sf orterun "$r/usr/bin/mpiexec"
  ln -sf opal_wrapper "$r/usr/bin/mpicxx"
  ln -sf opal_wrapper "$r/usr/bin/mpicc"
  ln -sf pkgconf "$r/usr/bin/pkg-config"
}

# One JSON line per result, as each benchmark prints them; fails if any of them failed.
# (Subshells: `set` stays inside, also when this file is sourced.)
gpu_host_bench() (
  set -u
  gpu_host_env "$1" || exit 1
  local b="${EMBER_BUILD_DIR:-build-gpu}" failed=0
  local mpirun=(mpirun --allow-run-as-root --oversubscribe)
  run() { timeout 300 "$@" || { echo "gpu_host.sh: failed: $*" >&2; failed=1; }; }
  for model in resnet20 resnet18; do
    run "$b/bench/train_step" --device cuda --model "$model" --steps 20
    run python3 bench/train_step_torch.py --device cuda --model "$model" --steps 20
    run "${mpirun[@]}" -np 1 "$b/bench/train_step" --device cuda --model "$model" --ddp --steps 20
  done
  run "${mpirun[@]}" -np 1 "$b/bench/allreduce" --cuda
  run "${mpirun[@]}" -np 2 "$b/bench/allreduce" --cuda
  run "$b/bench/gemm_bench" --quick
  exit "$failed"
)

# Configures and builds in EMBER_BUILD_DIR (after gpu_host_env): what build and
# scripts/gpu_session.sh share.
gpu_host_compile() (
  set -euo pipefail
  local build="${EMBER_BUILD_DIR:-build-gpu}"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON \
    -DEMBER_CUDA_ARCHITECTURES="${EMBER_CUDA_ARCHITECTURES:-90}" \
    -DEMBER_CUDNN_ROOT="${EMBER_CUDNN_ROOT:-}" -DEMBER_NCCL_ROOT="${EMBER_NCCL_ROOT:-}" \
    -DMPI_CXX_COMPILER="$EMBER_DEB_ROOT/usr/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$EMBER_DEB_ROOT/usr/bin/mpirun" \
    -DPKG_CONFIG_EXECUTABLE="$EMBER_DEB_ROOT/usr/bin/pkg-config"
  cmake --build "$build" -j "${EMBER_JOBS:-$(nproc)}"
)

gpu_host_build() (
  set -euo pipefail
  gpu_host_env "$1"
  gpu_host_compile
  local build="${EMBER_BUILD_DIR:-build-gpu}"
  (cd "$build" && ctest -j "${EMBER_JOBS:-$(nproc)}" --timeout 300 --output-on-failure)
)

# Sourced: return, never exit the caller's shell.
gpu_host_main() {
  local command="${1:-}" dir="${2:-}"
  case "$command" in
    "")
      # Sourced for its functions and package lists alone.
      [ "${BASH_SOURCE[0]}" != "$0" ] && return 0
      sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      return 2
      ;;
    fetch | fetch-runtime | fetch-data | env | build | bench)
      if [ -z "$dir" ]; then
        echo "gpu_host.sh $command: give the folder of the .deb files" >&2
        return 2
      fi
      "gpu_host_${command//-/_}" "$dir"
      ;;
    *)
      sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
      return 2
      ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  gpu_host_main "$@"
  exit $?
fi
gpu_host_main "$@"

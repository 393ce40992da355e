#!/usr/bin/env bash
# Configures, builds and runs the DDP example (apps/example) out of tree against an installed
# ember (the prefix the install_prefix test filled): alone, under mpirun -np 2 and under the
# installed ember-run with 2 workers on the CPU, and alone on the GPU where one is visible.
#   example_test.sh <install prefix> <source dir> <ON when ember was built with CUDA>
set -euo pipefail
prefix="$1"
source_dir="$2"
with_cuda="${3:-OFF}"
work="$(mktemp -d "${TMPDIR:-/tmp}/ember-install-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT

test -f "$prefix/include/ember/ember.h"
test -f "$prefix/lib/cmake/Ember/EmberConfig.cmake"
cmake -S "$source_dir/apps/example" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/ddp_example"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --allow-run-as-root --oversubscribe -np 2 "$work/build/ddp_example"
"$prefix/bin/ember-run" --nproc-per-node 2 "$work/build/ddp_example"
if [ "$with_cuda" = ON ] && nvidia-smi -L >/dev/null 2>&1; then "$work/build/ddp_example" cuda; fi
echo "installed package: example built and ran out of tree"

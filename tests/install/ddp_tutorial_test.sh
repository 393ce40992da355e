#!/usr/bin/env bash
# PyTorch's DDP tutorial series ported to ember (tests/install/ddp_tutorial), built out of tree
# against the installed package and run the three ways its users run it:
#   multigpu           under dist::spawn (mp.spawn): 2 ranks x batch 32 end where 1 rank x
#                      batch 64 does (to 1e-8), ranks agree bit for bit, every epoch's loop
#                      visits set_epoch's order, and the guarded checkpoint holds rank 0's state
#   multigpu_torchrun  under the installed ember-run: a worker SIGKILLed mid-run is restarted
#                      (--max-restarts 1), resumes from the snapshot at the right epoch and ends
#                      with the unbroken run's parameters, bit for bit; and under mpirun -np 2
#   ddp_tutorial_test.sh <install prefix> <source dir>
set -euo pipefail
prefix="$1"
source_dir="$2"
work="$(mktemp -d "${TMPDIR:-/tmp}/ember-ddp-tutorial.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "ddp_tutorial_test.sh: $*" >&2
  exit 1
}
# Two files of numbers, one a line, equal to within a tolerance.
same_numbers() {
  paste "$1" "$2" | awk -v tol="$3" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > tol) bad = 1; n++ }
    END { exit (bad || n == 0) }'
}

cmake -S "$source_dir/tests/install/ddp_tutorial" -B "$work/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
bin="$work/build"

# mp.spawn: world sizes 2 and 1 at the same global batch.
"$bin/multigpu" 2 1 4 32 "$work/ckpt2.safetensors" "$work/spawn2.txt"
"$bin/multigpu" 1 1 4 64 "$work/ckpt1.safetensors" "$work/spawn1.txt"
same_numbers "$work/spawn2.txt" "$work/spawn1.txt" 1e-8 ||
  fail "2 ranks x 32 and 1 rank x 64 end with different parameters"

# torchrun-style: an unbroken run, then one whose rank 1 is killed in epoch 3.
run=("$prefix/bin/ember-run" --nproc-per-node 2)
"${run[@]}" "$bin/multigpu_torchrun" 6 1 "$work/unbroken.safetensors" "$work/unbroken.txt"
"${run[@]}" --max-restarts 1 "$bin/multigpu_torchrun" 6 1 "$work/snap.safetensors" \
  "$work/restarted.txt" 3 >"$work/restarted.log" 2>&1 || {
  cat "$work/restarted.log" >&2
  fail "the restarted run failed"
}
grep -q "Resuming training from snapshot at Epoch 3" "$work/restarted.log" || {
  cat "$work/restarted.log" >&2
  fail "the restarted workers did not resume at epoch 3"
}
cmp -s "$work/unbroken.txt" "$work/restarted.txt" ||
  fail "the restarted run's parameters differ from the unbroken run's"

# gloo under mpirun meets at MASTER_ADDR:MASTER_PORT, as PyTorch's does.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 \
  -x MASTER_PORT=$((20000 + RANDOM % 20000)) \
  "$bin/multigpu_torchrun" 6 1 "$work/mpi.safetensors" "$work/mpi.txt"
same_numbers "$work/unbroken.txt" "$work/mpi.txt" 1e-12 ||
  fail "the run under mpirun ends elsewhere than the one under ember-run"
echo "ddp tutorial: spawn, ember-run with a killed worker and mpirun give PyTorch's answers"

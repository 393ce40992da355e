#!/usr/bin/env bash
# PyTorch's fault-tolerance tutorial (multigpu_torchrun.py) ported to the installed
# apps::Trainer (trainer/ beside this script), built out of tree with find_package(Ember)
# against an installed ember, and run the way the tutorial is:
#   1. alone, uninterrupted: the reference parameters;
#   2. alone, killed (SIGKILL) at step 11 and started again: it resumes from the snapshot of
#      step 8 (mid-epoch 1) and ends with the reference's parameters, bit for bit;
#   3. under ember-run --nproc-per-node 2, uninterrupted; then with --max-restarts 1 and rank 1
#      killed at step 11: ember-run restarts both workers, they resume from the snapshot of
#      epoch 1 (step 8) and end equal to the uninterrupted 2-rank run.
#   trainer_test.sh <install prefix> <source dir>
set -euo pipefail
prefix="$(cd "$1" && pwd)"
source_dir="$(cd "$2" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/ember-trainer-test.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() {
  echo "trainer_test.sh: $*" >&2
  exit 1
}

cmake -S "$source_dir/tests/install/trainer" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" >"$work/configure.log" 2>&1 || {
  cat "$work/configure.log" >&2
  fail "configuring the port against $prefix failed"
}
cmake --build "$work/build" >"$work/build.log" 2>&1 || {
  cat "$work/build.log" >&2
  fail "building the port against $prefix failed"
}
program="$work/build/multigpu_torchrun"
epochs=3
save_every=4

# Runs "$@" with its output in $work/$name.log; fails, showing it, unless it exits $expected.
run() {
  local name="$1" expected="$2"
  shift 2
  local status=0
  "$@" >"$work/$name.log" 2>&1 || status=$?
  if [[ "$status" != "$expected" ]]; then
    cat "$work/$name.log" >&2
    fail "$name exited $status, not $expected"
  fi
}
expect_in_log() {
  grep -q -F -- "$2" "$work/$1.log" || {
    cat "$work/$1.log" >&2
    fail "$1 did not print: $2"
  }
}
same_parameters() {
  cmp -s "$work/$1/final.txt" "$work/$2/final.txt" || {
    diff "$work/$1/final.txt" "$work/$2/final.txt" | head -5 >&2
    fail "$2 ended with other parameters than $1"
  }
}

# 1 and 2: alone (16 steps an epoch).
run alone 0 "$program" "$work/alone" $epochs $save_every
expect_in_log alone "no snapshot in $work/alone/snapshots: starting from scratch"
run killed 137 "$program" "$work/killed" $epochs $save_every 11
[[ ! -e "$work/killed/final.txt" ]] || fail "the killed run finished"
run resumed 0 "$program" "$work/killed" $epochs $save_every
expect_in_log resumed "resumed from $work/killed/snapshots/checkpoint-step-8.safetensors at step 8 (epoch 1)"
expect_in_log resumed "resumed at epoch 0, 48 steps"
same_parameters alone killed
echo "alone: killed at step 11, resumed from step 8 mid-epoch, parameters equal the uninterrupted run's"

# 3: two workers under ember-run (8 steps an epoch), the second killed on the first attempt.
launcher="$prefix/bin/ember-run"
run two 0 "$launcher" --nproc-per-node 2 "$program" "$work/two" $epochs $save_every
run two-killed 0 "$launcher" --nproc-per-node 2 --max-restarts 1 "$program" "$work/two-killed" \
  $epochs $save_every 11
expect_in_log two-killed "resumed from $work/two-killed/snapshots/checkpoint-epoch-1.safetensors at step 8 (epoch 2)"
expect_in_log two-killed "2 rank(s), resumed at epoch 1, 24 steps"
same_parameters two two-killed
echo "ember-run: rank 1 killed at step 11, restarted, resumed at epoch 1, parameters equal the uninterrupted run's"

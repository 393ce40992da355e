#!/usr/bin/env bash
# ember-train --zero on CPU processes over TCP (--deterministic, gradient clipping and 2
# micro-batches per step), with sharded snapshots:
# - ZeRO-1 and ZeRO-2 runs on 2 ranks end at the plain DDP run's parameters bit for bit, and
#   write sharded snapshots (a folder: index, one shard per rank, the rest beside them);
#   --keep covers the folders;
# - snapshots resume across the switch: a plain snapshot continued under --zero 2, and a
#   --zero 2 one continued without it writes the uninterrupted run's file byte for byte (model,
#   optimizer state, schedule, every rank's random state, sampler position, sums);
#   --resume auto finds a sharded folder newer than a plain file;
# - resized (f64, --sync-bn, a fixed --global-batch-size): a --zero 2 snapshot of 2 ranks taken
#   mid-epoch, resumed on 3 ranks under --zero 1 and on 1 rank without --zero, ends at the
#   uninterrupted run's parameters to 1e-12 (summation order); a --zero load allocates less
#   than 2/3 of the optimizer state on every rank of 3 (its third, plus one parameter's while
#   loading), a plain one all of it;
# - a small GPT (AdamW over two parameter groups) under --zero 2: the plain run's parameters.
# Exits 77 (ctest: skipped) without the built-in dataset.
#   train_zero.sh <ember-train> <work dir> <ember_snapshot_diff>
set -euo pipefail
train="$1"
work="$2"
diff_tool="$3"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
# run_on RANKS NAME ZERO [ARGS...]: 6 steps, snapshots at steps 3 and 6 in $work/NAME.
run_on() {
  local ranks="$1" name="$2" zero="$3"
  shift 3
  TORCHRUN_STYLE_TIMEOUT=240 bash "$(dirname "$0")/torchrun_style.sh" "$ranks" "$train" \
    --device cpu --threads 1 --workers 0 --accum-steps 2 --grad-clip 0.5 --max-steps 6 \
    --epochs 1 --deterministic --zero "$zero" --save-every-steps 3 \
    --checkpoint-dir "$work/$name" --out-dir "$work/out-$name" "$@" >"$work/$name.out" 2>&1 ||
    { cat "$work/$name.out"; exit 1; }
}
run() {
  local name="$1" zero="$2"
  shift 2
  run_on 2 "$name" "$zero" --batch-size 16 "$@"
}
same() {
  cmp "$1" "$2" || { echo "FAIL: $1 and $2 differ"; exit 1; }
}
# close A B TOLERANCE: the model parameters of two snapshots (files or folders).
close() {
  "$diff_tool" "$1" "$2" "$3" || { echo "FAIL: $1 and $2"; exit 1; }
}
sharded() {
  for f in index.json snapshot.safetensors; do
    [ -f "$1/$f" ] || { echo "FAIL: $1 has no $f"; ls -l "$1"; exit 1; }
  done
  [ "$(ls "$1" | grep -c "^shard-.-of-$2-.*\.safetensors$")" = "$2" ] ||
    { echo "FAIL: $1 does not hold $2 shards"; ls -l "$1"; exit 1; }
}
run plain 0
run zero1 1 --keep 1
run zero2 2
grep -q ", ZeRO-2" "$work/zero2.out"
sharded "$work/zero2/checkpoint-step-3" 2
sharded "$work/zero2/checkpoint-step-6" 2
close "$work/plain/checkpoint-step-6.safetensors" "$work/zero1/checkpoint-step-6" 0
close "$work/plain/checkpoint-step-6.safetensors" "$work/zero2/checkpoint-step-6" 0
[ ! -e "$work/zero1/checkpoint-step-3" ] || { echo "FAIL: --keep 1 left step 3"; exit 1; }
# Resumed across the switch, both ways.
mkdir -p "$work/to-zero" "$work/from-zero"
cp "$work/plain/checkpoint-step-3.safetensors" "$work/to-zero/"
cp -r "$work/zero2/checkpoint-step-3" "$work/from-zero/"
run to-zero 2 --resume auto
run from-zero 0 --resume auto
grep -q "resumed from .*checkpoint-step-3.safetensors at step 3" "$work/to-zero.out"
grep -q "resumed from .*checkpoint-step-3 at step 3" "$work/from-zero.out"
close "$work/plain/checkpoint-step-6.safetensors" "$work/to-zero/checkpoint-step-6" 0
same "$work/plain/checkpoint-step-6.safetensors" "$work/from-zero/checkpoint-step-6.safetensors"
# The newest of both kinds: the sharded step 6 over the plain step 3.
run to-zero 0 --resume auto
grep -q "resumed from .*to-zero/checkpoint-step-6 at step 6" "$work/to-zero.out" ||
  { cat "$work/to-zero.out"; echo "FAIL: --resume auto did not find the sharded step 6"; exit 1; }
# Resized: 48 images a step on 2, 3 and 1 rank(s).
resize=(--global-batch-size 48 --dtype f64 --sync-bn)
run_on 2 ref 2 "${resize[@]}"
for n in 3 1; do
  mkdir -p "$work/on$n"
  cp -r "$work/ref/checkpoint-step-3" "$work/on$n/"
done
run_on 3 on3 1 "${resize[@]}" --resume auto
run_on 1 on1 0 "${resize[@]}" --resume auto
for n in 3 1; do
  grep -q "resumed from .*on$n/checkpoint-step-3 at step 3" "$work/on$n.out"
  grep -q "this run has $n rank(s) with a global batch of 48" "$work/on$n.out"
done
close "$work/ref/checkpoint-step-6" "$work/on3/checkpoint-step-6" 1e-12
close "$work/ref/checkpoint-step-6" "$work/on1/checkpoint-step-6.safetensors" 1e-12
# The comparison can fail: step 3 is not step 6.
if "$diff_tool" "$work/ref/checkpoint-step-3" "$work/ref/checkpoint-step-6" 1e-10; then
  echo "FAIL: steps 3 and 6 compare equal"
  exit 1
fi
# Memory on load: "at most X bytes allocated on a rank ...; the whole optimizer state is Y".
read_bytes() {
  sed -n 's/.*sharded snapshot read: at most \([0-9]*\) bytes.* state is \([0-9]*\) bytes.*/\1 \2/p' \
    "$1" | head -1
}
read -r peak3 whole3 <<<"$(read_bytes "$work/on3.out")"
read -r peak1 whole1 <<<"$(read_bytes "$work/on1.out")"
echo "load on 3 ranks under --zero 1: at most $peak3 of $whole3 bytes; on 1 plain: $peak1"
# Each of 3 ranks owns about a third; with one parameter's state while loading, below 2/3.
[ $((3 * peak3)) -lt $((2 * whole3)) ] ||
  { echo "FAIL: a --zero rank allocated more than 2/3 of the state"; exit 1; }
[ "$peak1" -ge "$whole1" ] || { echo "FAIL: the plain load read less than the state"; exit 1; }
# A small GPT: AdamW over two weight-decay groups.
gpt=(--model gpt --n-layer 2 --n-head 2 --n-embd 64 --block-size 32)
run gpt-plain 0 "${gpt[@]}"
run gpt-zero2 2 "${gpt[@]}"
close "$work/gpt-plain/checkpoint-step-6.safetensors" "$work/gpt-zero2/checkpoint-step-6" 0
echo "ember-train --zero 1 and 2: the plain run's parameters, sharded snapshots, resumed" \
  "across the switch and on 3 and 1 ranks"

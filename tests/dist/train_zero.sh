#!/usr/bin/env bash
# ember-train --zero on 2 CPU processes over TCP (--deterministic, gradient clipping and 2
# micro-batches per step): ZeRO-1 and ZeRO-2 runs write the same snapshot bytes as the plain
# DDP run (model, optimizer state consolidated in the plain format, schedule, random states),
# and snapshots resume across the switch: a plain snapshot continued under --zero 2 and a
# --zero 2 one continued without it end in the uninterrupted run's bytes. The same bytes for a
# small GPT (AdamW over two parameter groups) under --zero 2. Exits 77 (ctest: skipped) without
# the built-in dataset.
#   train_zero.sh <ember-train> <work dir>
set -euo pipefail
train="$1"
work="$2"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
# run NAME ZERO [ARGS...]: 6 steps, snapshots at steps 3 and 6 in $work/NAME.
run() {
  local name="$1" zero="$2"
  shift 2
  TORCHRUN_STYLE_TIMEOUT=240 bash "$(dirname "$0")/torchrun_style.sh" 2 "$train" --device cpu \
    --threads 1 --workers 0 --batch-size 16 --accum-steps 2 --grad-clip 0.5 --max-steps 6 \
    --epochs 1 --deterministic --zero "$zero" --save-every-steps 3 \
    --checkpoint-dir "$work/$name" --out-dir "$work/out-$name" "$@" >"$work/$name.out" 2>&1 ||
    { cat "$work/$name.out"; exit 1; }
}
same() {
  cmp "$1" "$2" || { echo "FAIL: $1 and $2 differ"; exit 1; }
}
run plain 0
run zero1 1
run zero2 2
grep -q ", ZeRO-2" "$work/zero2.out"
same "$work/plain/checkpoint-step-3.safetensors" "$work/zero1/checkpoint-step-3.safetensors"
same "$work/plain/checkpoint-step-6.safetensors" "$work/zero1/checkpoint-step-6.safetensors"
same "$work/plain/checkpoint-step-6.safetensors" "$work/zero2/checkpoint-step-6.safetensors"
# Resumed across the switch, both ways.
mkdir -p "$work/to-zero" "$work/from-zero"
cp "$work/plain/checkpoint-step-3.safetensors" "$work/to-zero/"
cp "$work/zero2/checkpoint-step-3.safetensors" "$work/from-zero/"
run to-zero 2 --resume auto
run from-zero 0 --resume auto
grep -q "resumed from .*checkpoint-step-3.safetensors at step 3" "$work/to-zero.out"
grep -q "resumed from .*checkpoint-step-3.safetensors at step 3" "$work/from-zero.out"
same "$work/plain/checkpoint-step-6.safetensors" "$work/to-zero/checkpoint-step-6.safetensors"
same "$work/plain/checkpoint-step-6.safetensors" "$work/from-zero/checkpoint-step-6.safetensors"
# A small GPT: AdamW over two weight-decay groups.
gpt=(--model gpt --n-layer 2 --n-head 2 --n-embd 64 --block-size 32)
run gpt-plain 0 "${gpt[@]}"
run gpt-zero2 2 "${gpt[@]}"
same "$work/gpt-plain/checkpoint-step-6.safetensors" "$work/gpt-zero2/checkpoint-step-6.safetensors"
echo "ember-train --zero 1 and 2 wrote the plain run's snapshots and resumed across the switch"

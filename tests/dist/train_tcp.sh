#!/usr/bin/env bash
# ember-train on the CPU without mpirun: 2 processes started torchrun-style meet over the TCP
# backend and train a few steps. Exits 77 (ctest: skipped) without the built-in dataset.
#   train_tcp.sh <ember-train> <work dir>
set -euo pipefail
train="$1"
work="$2"
if [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
TORCHRUN_STYLE_TIMEOUT=240 bash "$(dirname "$0")/torchrun_style.sh" 2 "$train" --device cpu \
  --threads 1 --workers 0 --batch-size 32 --max-steps 4 --epochs 1 --out-dir "$work/out" 2>&1 |
  tee "$work/train.out"
grep -q " 2 rank(s) on cpu (tcp)" "$work/train.out"
grep -q "^done: 4 steps" "$work/train.out"
test -s "$work/out/metrics.jsonl"
echo "ember-train trained on 2 CPU processes over the TCP backend"

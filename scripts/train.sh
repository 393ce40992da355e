#!/usr/bin/env bash
# ember's main job on a fresh machine: installs what is missing and builds
# (scripts/setup.sh), then trains ResNet-20 with ember-train on the built-in dataset
# (Fashion-MNIST from Debian's package) for one epoch with the default recipe (one-cycle
# schedule over the epoch's 468 steps), which takes minutes on a CPU. The metrics and the
# curves land in runs/latest/ (metrics.jsonl, curves.png).
# Arguments go to ember-train and override the defaults, e.g.
#   bash scripts/train.sh --epochs 10
#   bash scripts/train.sh --dataset cifar10 --data ~/datasets --model resnet56
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo_root/scripts/setup.sh"
build_dir="${EMBER_BUILD_DIR:-build}"
[[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"
exec "$build_dir/apps/ember-train" --epochs 1 --out-dir "$repo_root/runs/latest" "$@"

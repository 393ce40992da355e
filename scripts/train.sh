#!/usr/bin/env bash
# ember's main job on a fresh machine: installs the packages training needs and builds
# ember-train alone (scripts/setup.sh --train: build-train/, the CUDA backend only where a GPU
# is visible), then trains ResNet-20 with ember-train on the built-in dataset (Fashion-MNIST
# from Debian's package) for one epoch with the default recipe (one-cycle schedule over the
# epoch's 468 steps), which takes minutes on a CPU. Each phase prints what it does and how
# long it took (packages, configure, build, training); a second run installs and builds
# nothing that is already there. The metrics and the curves land in runs/latest/
# (metrics.jsonl, curves.png).
# Arguments go to ember-train and override the defaults, e.g.
#   bash scripts/train.sh --epochs 10
#   bash scripts/train.sh --dataset cifar10 --data ~/datasets --model resnet56
# Environment: as scripts/setup.sh (EMBER_TRAIN_BUILD_DIR, EMBER_CMAKE_ARGS, EMBER_JOBS, ...).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/phase.sh
source "$repo_root/scripts/phase.sh"
start="$(phase_clock)"
bash "$repo_root/scripts/setup.sh" --train
build_dir="${EMBER_TRAIN_BUILD_DIR:-build-train}"
[[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"

phase training "ember-train --epochs 1 $*"
"$build_dir/apps/ember-train" --epochs 1 --out-dir "$repo_root/runs/latest" "$@"
phase_done "metrics and curves in runs/latest/"
echo "==> total: $(phase_seconds_since "$start")"

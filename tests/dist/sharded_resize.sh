#!/usr/bin/env bash
# A sharded snapshot saved by 3 ranks and loaded by 2, 4 and 1 (each a torchrun-style job over
# TCP): sharded_resize_main checks the values, that every element is read once, and the
# memory each loading rank allocates.
#   sharded_resize.sh SHARDED_RESIZE_MAIN
set -eu
main=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$here/torchrun_style.sh" 3 "$main" save "$work/snapshot"
for n in 2 4 1; do
  bash "$here/torchrun_style.sh" "$n" "$main" load "$work/snapshot" 3
done

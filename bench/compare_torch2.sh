#!/usr/bin/env bash
# ember beside PyTorch 2.x on the CPU, eager and torch.compile, every side-by-side benchmark
# (bench/compare_torch2.py lists them) run three times: makes PyTorch's venv first when it
# is missing (scripts/torch_ref.sh), builds the benchmark programs, then writes one JSON file
# under bench/results/ and prints the README's table from it.
#
#   bash bench/compare_torch2.sh [--build DIR] [--python PY] [--runs N] [--quick] [--only IDS]
#                                [--out FILE] [--deadline-min M]
#   bash bench/compare_torch2.sh --table bench/results/FILE.json     # the table again
#
# PyTorch 2.x runs under --python PY, else EMBER_TORCH_PYTHON, else scripts/torch_ref.sh's
# venv; Debian's /usr/bin/python3 (PyTorch 1.13) adds the continuity rows.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
python=""
args=()
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --table) exec /usr/bin/python3 "$here/compare_torch2.py" --table "$2" ;;
    -h | --help) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
# shellcheck source=scripts/torch_python.sh
source "$here/../scripts/torch_python.sh"
if [[ -z "$python" && -z "${EMBER_TORCH_PYTHON:-}" ]]; then
  bash "$here/../scripts/torch_ref.sh"
fi
python="${python:-$(torch_python)}"
cmake --build "$build" --target train_step gpt_step attention_bench gpt_layers_bench optim_bench loader_bench
exec /usr/bin/python3 "$here/compare_torch2.py" --build "$build" --python "$python" "${args[@]}"

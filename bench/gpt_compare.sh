#!/usr/bin/env bash
# GPT training step, ember and PyTorch side by side in one run: the same flags to
# bench/gpt_step (BUILD/bench/gpt_step) and bench/gpt_step_torch.py, one JSON line each, then
# a line with ember's tokens/s over PyTorch's.
#
#   bash bench/gpt_compare.sh [--build DIR] [--python PY] [flags for both...]
#   bash bench/gpt_compare.sh --threads 2 --batch 8              # CPU, Debian's torch 1.13
#   bash bench/gpt_compare.sh --device cuda --precision bf16 --n-layer 12 --n-embd 768 \
#       --n-head 12 --block-size 1024 --batch 8                  # GPU
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
python=/usr/bin/python3
args=()
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
ember_line="$("$build/bench/gpt_step" "${args[@]}")"
torch_line="$("$python" "$here/gpt_step_torch.py" "${args[@]}")"
echo "$ember_line"
echo "$torch_line"
"$python" - "$ember_line" "$torch_line" <<'PY'
import json, sys
ember, torch = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(json.dumps({"compare": "gpt_step", "model": ember["model"], "device": ember["device"],
                  "precision": ember["precision"], "torch": torch["framework"],
                  "ember_over_torch_tokens_per_s": round(ember["tokens_per_s"] / torch["tokens_per_s"], 3)}))
PY

#!/usr/bin/env bash
# GPT training step, ember and PyTorch side by side in one run: the same flags to
# bench/gpt_step (BUILD/bench/gpt_step) and bench/gpt_step_torch.py, one JSON line each, then
# a line with ember's tokens/s over PyTorch's. --sdpa-kernels "simple tensor_core" runs ember's
# step once per CUDA attention kernel (EMBER_SDPA_CUDA_KERNEL, tensor/cuda/attention.cu), each
# with its own comparison line (its "sdpa_kernel" key names it); without it the variable is
# left as the caller set it. --ember-args "FLAGS" go to ember's step alone (--cuda-graphs:
# the whole step replayed from one CUDA graph, beside PyTorch eager).
#
#   bash bench/gpt_compare.sh [--build DIR] [--python PY] [--sdpa-kernels "K ..."]
#                             [--ember-args "FLAGS"] [flags...]
# PyTorch's side runs under --python PY, else EMBER_TORCH_PYTHON, else scripts/torch_ref.sh's
# PyTorch 2.x venv where it was made, else Debian's /usr/bin/python3 (PyTorch 1.13).
#   bash bench/gpt_compare.sh --threads 2 --batch 8              # CPU
#   bash bench/gpt_compare.sh --device cuda --precision bf16 --n-layer 12 --n-embd 768 \
#       --n-head 12 --block-size 1024 --batch 8                  # GPU
#   bash bench/gpt_compare.sh --sdpa-kernels "simple tensor_core" --device cuda --precision bf16 \
#       --n-layer 6 --n-embd 384 --n-head 6 --block-size 256 --batch 64
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
# shellcheck source=scripts/torch_python.sh
source "$here/../scripts/torch_python.sh"
python="$(torch_python)"  # --python overrides
kernels=""
args=()
ember_args=()
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --sdpa-kernels) kernels="$2"; shift 2 ;;
    --ember-args) read -r -a ember_args <<<"$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
torch_line=""
run_torch() {
  if [[ -z "$torch_line" ]]; then
    torch_line="$("$python" "$here/gpt_step_torch.py" "${args[@]}")"
    echo "$torch_line"
  fi
}
compare() {  # ember's line, torch's line, the kernel named (or "")
  "$python" - "$1" "$2" "$3" <<'PY'
import json, sys
ember, torch = json.loads(sys.argv[1]), json.loads(sys.argv[2])
line = {"compare": "gpt_step", "model": ember["model"], "device": ember["device"],
        "precision": ember["precision"], "torch": torch["framework"],
        "ember_cuda_graphs": ember.get("cuda_graphs", False),
        "ember_over_torch_tokens_per_s": round(ember["tokens_per_s"] / torch["tokens_per_s"], 3)}
if sys.argv[3]:
    line["sdpa_kernel"] = sys.argv[3]
print(json.dumps(line))
PY
}
if [[ -z "$kernels" ]]; then
  ember_line="$("$build/bench/gpt_step" "${args[@]}" "${ember_args[@]}")"
  echo "$ember_line"
  run_torch
  compare "$ember_line" "$torch_line" ""
else
  for kernel in $kernels; do
    ember_line="$(EMBER_SDPA_CUDA_KERNEL="$kernel" "$build/bench/gpt_step" "${args[@]}" "${ember_args[@]}")"
    echo "$ember_line"
    run_torch
    compare "$ember_line" "$torch_line" "$kernel"
  done
fi

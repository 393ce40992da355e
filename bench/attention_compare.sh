#!/usr/bin/env bash
# Scaled-dot-product attention on CUDA, forward and forward+backward: ember's two kernels
# (EMBER_SDPA_CUDA_KERNEL=simple and =tensor_core) beside PyTorch's
# F.scaled_dot_product_attention (FlashAttention-2), at the GPT training step's shapes: head dim
# 64, causal, bf16; B*H 48, 96 and 384 at L 256 (6 heads), 48 and 96 at L 1024 (12 heads).
# Prints attention_bench's and attention_torch.py's JSON lines, then per size and pass a line
# with each ember kernel's time over PyTorch's (below 1: ember is faster).
#
#   bash bench/attention_compare.sh [--build DIR] [--python PY] [--dtype bf16|f16]
#                                   [--sizes "L:B:H ..."]
# PyTorch's side runs under --python PY, else EMBER_TORCH_PYTHON, else scripts/torch_ref.sh's
# PyTorch 2.x venv where it was made, else Debian's /usr/bin/python3 (PyTorch 1.13).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$here/../build"
# shellcheck source=scripts/torch_python.sh
source "$here/../scripts/torch_python.sh"
python="$(torch_python)"  # --python overrides
dtype=bf16
sizes="256:8:6 256:16:6 256:64:6 1024:4:12 1024:8:12"
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    --dtype) dtype="$2"; shift 2 ;;
    --sizes) sizes="$2"; shift 2 ;;
    *)
      echo "usage: bash bench/attention_compare.sh [--build DIR] [--python PY] [--dtype bf16|f16] [--sizes \"L:B:H ...\"]" >&2
      exit 2 ;;
  esac
done
for size in $sizes; do
  IFS=: read -r length batch heads <<<"$size"
  common=(--device cuda --dtype "$dtype" --dim 64 --causal 1 --length "$length" --batch "$batch"
          --heads "$heads")
  ember_lines="$("$build/bench/attention_bench" "${common[@]}" --no-composed)"
  torch_lines="$("$python" "$here/attention_torch.py" "${common[@]}" --impl sdpa)"
  echo "$ember_lines"
  echo "$torch_lines"
  "$python" - "$ember_lines" "$torch_lines" <<'PY'
import json, sys
rows = [json.loads(line) for part in sys.argv[1:] for line in part.splitlines() if line.strip()]
ms = {(r["impl"], r["pass"]): r["ms"] for r in rows}
first = rows[0]
for p in ("forward", "forward_backward"):
    torch_ms = ms[("torch_sdpa", p)]
    print(json.dumps({"compare": "attention", "pass": p, "length": first["length"],
                      "batch_heads": first["batch"] * first["heads"], "dim": first["dim"],
                      "dtype": first["dtype"], "torch_ms": torch_ms,
                      "simple_over_torch_time": round(ms[("ember_fused_simple", p)] / torch_ms, 3),
                      "tensor_core_over_torch_time":
                          round(ms[("ember_fused_tensor_core", p)] / torch_ms, 3)}))
PY
done

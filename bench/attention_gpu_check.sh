#!/usr/bin/env bash
# What a GPU session runs for the tensor-core attention kernel (tensor/cuda/attention_tc.cu)
# once a CUDA build exists (scripts/gpu_session.sh's build stage, or any build with the
# tests and benchmarks). Stages, in order, default all; each writes under $OUT:
#   test      the attention tests: tensor-core kernel emulated and on the GPU against the CPU
#             op, the simple kernel beside it, LayersParity.ScaledDotProductAttention (tests.log)
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck on every kernel variant at
#             small shapes (sanitizer.log)
#   attention bench/attention_compare.sh: both CUDA kernels' forward and forward+backward
#             beside PyTorch's F.scaled_dot_product_attention, bf16, D 64, causal, B*H 48..384
#             at L 256 and 1024 (attention.jsonl)
#   gpt       bench/gpt_compare.sh --sdpa-kernels "simple tensor_core", bf16, 10 steps, the 6-layer
#             384-wide GPT at block 256 batch 64 and the 12-layer 768-wide one at block 1024
#             batch 8 (gpt.jsonl)
#
#   OUT=DIR bash bench/attention_gpu_check.sh [--build DIR] [--python PY] [STAGE...]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${EMBER_BUILD_DIR:-$here/../build-gpu}"
python=python3
stages=()
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --python) python="$2"; shift 2 ;;
    *) stages+=("$1"); shift ;;
  esac
done
[ ${#stages[@]} -eq 0 ] && stages=(test sanitize attention gpt)
if [ -z "${OUT:-}" ]; then
  sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
mkdir -p "$OUT"
tests="$build/tests/ember_tensor_tests"
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"

for stage in "${stages[@]}"; do
  case "$stage" in
    test)
      timeout 600 "$tests" --gtest_filter='AttentionTensorCore.*:LayersParity.ScaledDotProductAttention:Attention.*' \
        >"$OUT/tests.log" 2>&1
      echo "test: exit $? ($(grep -c '^\[       OK' "$OUT/tests.log") ok, $(grep -c '^\[  FAILED  \] Att\|^\[  FAILED  \] Lay' "$OUT/tests.log") failed)"
      ;;
    sanitize)
      if [ ! -x "$sanitizer" ]; then
        echo "sanitize: no compute-sanitizer (PATH or /usr/local/cuda/bin), skipped"
        continue
      fi
      : >"$OUT/sanitizer.log"
      for tool in memcheck racecheck synccheck; do
        echo "== $tool" >>"$OUT/sanitizer.log"
        timeout 300 "$sanitizer" --tool "$tool" --error-exitcode 9 "$tests" \
          --gtest_filter='AttentionTensorCore.CudaSmallShapesEveryVariant' >>"$OUT/sanitizer.log" 2>&1
        echo "sanitize $tool: exit $?"
      done
      ;;
    attention)
      timeout 600 bash "$here/attention_compare.sh" --build "$build" --python "$python" \
        >"$OUT/attention.jsonl" 2>"$OUT/attention.err"
      echo "attention: exit $?"
      ;;
    gpt)
      : >"$OUT/gpt.jsonl"
      for size in "--n-layer 6 --n-embd 384 --n-head 6 --block-size 256 --batch 64" \
                  "--n-layer 12 --n-embd 768 --n-head 12 --block-size 1024 --batch 8"; do
        # shellcheck disable=SC2086
        timeout 600 bash "$here/gpt_compare.sh" --build "$build" --python "$python" \
          --sdpa-kernels "simple tensor_core" --device cuda --precision bf16 --steps 10 $size \
          >>"$OUT/gpt.jsonl" 2>>"$OUT/gpt.err"
        echo "gpt ($size): exit $?"
      done
      ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done

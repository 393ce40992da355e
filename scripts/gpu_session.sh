#!/usr/bin/env bash
# One GPU session (about 15 minutes of device time, one or two calls): build, the whole test
# suite with the CUDA tests, and the training-step benchmarks beside PyTorch, everything
# written under $OUT as each stage finishes, so a stage cut short by a time limit keeps what
# ran before it.
#
#   OUT=DIR bash scripts/gpu_session.sh DEBS [STAGE...]
#
# DEBS is the folder of .deb files for scripts/gpu_host.sh (fetched beforehand with
# `bash scripts/gpu_host.sh fetch DEBS`). STAGEs, in order, default all of them:
#   build   configure and build in build-gpu/ (gpu_host.sh's build, without its ctest)  ~4 min
#   test    the new GPU tests first (focused.log), then the whole suite under ctest
#           (ctest.log, ctest-junit.xml)                                                  ~3 min
#   gpt     bench/gpt_compare.sh --device cuda --precision bf16: the 6-layer 384-wide GPT at
#           block 256 and a GPT-2-small-sized one (12 layers, 768 wide, block 1024), ember
#           eager with each CUDA attention kernel (tensor_core, simple) and with the whole
#           step as one CUDA graph, beside PyTorch eager (F.scaled_dot_product_attention),
#           one JSON line each in gpt.jsonl                                                ~2 min
#   bench   build/bench/train_step and bench/train_step_torch.py --device cuda for ResNet-18
#           (CIFAR) and ResNet-20 at batch 128 and 512: (a) tf32, NCHW; (b) bf16 autocast and
#           channels_last; ember eager and with --cuda-graphs, PyTorch eager, then PyTorch
#           torch.compile at batch 512 (last: the slowest to start). One JSON line per run in
#           bench.jsonl, a table at the end                                               ~5 min
#   e2e     ember-train's default recipe end to end (ResNet-20 on Fashion-MNIST, E2E_EPOCHS
#           epochs, default 10, bf16, channels_last) beside bench/fashion_recipe_torch.py, the
#           same recipe in PyTorch on the GPU: wall time and final test accuracy, one JSON line
#           each in e2e.jsonl. Not in the default list: the dataset's .deb (31 MB) does not fit
#           beside DEBS in one call's 64 MiB, so it travels in a call of its own; its folder is
#           FASHION_DEBS (default DEBS), filled by `bash scripts/gpu_host.sh fetch-data DIR`  ~4 min
# Files under $OUT: session.log, build.log, focused.log, ctest.log, ctest-junit.xml,
# gpt.jsonl, bench.jsonl, bench.log; e2e.jsonl, e2e-ember.log, e2e-torch.log (8 at most come
# back from a device call).
#
# MFU uses the H100 SXM's dense peaks (an H200 has the same): 494.7 TFLOP/s TF32 and 989
# TFLOP/s bf16, and 3 x the forward FLOPs per image (ResNet-18-CIFAR 1.11 GFLOP forward).
# Environment: EMBER_BUILD_DIR (default build-gpu), BENCH_STEPS (timed steps, default 30),
# STAGE_TIMEOUT_BUILD / _TEST / _BENCH (seconds; 420, 300, 420), STAGE_TIMEOUT_E2E (each
# side's run, default 240), E2E_DEVICE (default cuda) and E2E_EXTRA (flags both sides take,
# e.g. "--max-steps 20" for a trial on the CPU), RUN_TIMEOUT (one benchmark run, seconds,
# default 120).
set -uo pipefail

if [ $# -lt 1 ] || [ -z "${OUT:-}" ]; then
  sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
debs="$1"
shift
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test gpt bench)
mkdir -p "$OUT"
export EMBER_BUILD_DIR="${EMBER_BUILD_DIR:-build-gpu}"
b="$EMBER_BUILD_DIR"
steps="${BENCH_STEPS:-30}"
run_timeout="${RUN_TIMEOUT:-120}"
export PYTHONUNBUFFERED=1

say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }

# gpu_host.sh's paths (the unpacked .deb files, the wheels' cuDNN and NCCL) and functions.
# shellcheck source=gpu_host.sh
source "$(dirname "$0")/gpu_host.sh" env "$debs" || {
  say "gpu_host.sh env $debs failed"
  exit 1
}

stage_build() {
  say "build: $b"
  timeout "${STAGE_TIMEOUT_BUILD:-420}" bash -c "source '$(dirname "$0")/gpu_host.sh' env '$debs' && gpu_host_compile" \
    >"$OUT/build.log" 2>&1
}

stage_test() {
  say "test: the new GPU tests"
  {
    "$b/tests/ember_tensor_tests" --gtest_filter='AttentionTensorCore.*:Attention.*:LayersParity.*:CudaGraph.*:CudaParity.*:Cuda.*:LinearBiasEpilogue.*:AmpOps.*:ChannelsLastCuda.*:Autocast.PolicyTableOnCuda'
    "$b/tests/ember_optim_tests" --gtest_filter='CapturableOptimizer.*:FusedGradScaling.*'
    "$b/tests/ember_nn_tests" --gtest_filter='ChannelsLast*:MultiheadSelfAttention.*'
    "$b/tests/ember_apps_tests" --gtest_filter='Trainer.*'
  } >"$OUT/focused.log" 2>&1
  say "focused: $(grep -c '^\[       OK' "$OUT/focused.log") passed, $(grep -c '^\[  FAILED  \] [A-Z]' "$OUT/focused.log") failed, $(grep -c '^\[  SKIPPED' "$OUT/focused.log") skipped"
  say "test: the whole suite"
  timeout "${STAGE_TIMEOUT_TEST:-300}" ctest --test-dir "$b" -j 8 --timeout 120 --output-on-failure \
    --output-junit "$OUT/ctest-junit.xml" >"$OUT/ctest.log" 2>&1
  local rc=$?
  say "ctest: exit $rc; $(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)"
  return $rc
}

# One benchmark run: its JSON line (the last line starting with '{') appended to bench.jsonl
# with the label of its row, its output to bench.log.
bench_run() {
  local label="$1"
  shift
  local out
  out="$(timeout "$run_timeout" "$@" 2>>"$OUT/bench.log")"
  local rc=$?
  echo "$label: $* -> exit $rc" >>"$OUT/bench.log"
  echo "$out" >>"$OUT/bench.log"
  local json
  json="$(printf '%s\n' "$out" | grep '^{' | tail -1)"
  if [ $rc -eq 0 ] && [ -n "$json" ]; then
    printf '{"row": "%s", %s\n' "$label" "${json#\{}" >>"$OUT/bench.jsonl"
  else
    printf '{"row": "%s", "error": "exit %s", "command": "%s"}\n' "$label" "$rc" "$*" >>"$OUT/bench.jsonl"
  fi
}

stage_bench() {
  say "bench: $steps timed steps a run"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$OUT/session.log" 2>&1
  local ember="$b/bench/train_step" torch=(python3 bench/train_step_torch.py)
  local model batch
  # (a) tf32 NCHW and (b) bf16 autocast + channels_last, ember (eager, graphs) and PyTorch eager.
  for model in resnet18 resnet20; do
    for batch in 128 512; do
      local common=(--device cuda --model "$model" --batch "$batch" --steps "$steps")
      local a=(--precision tf32 --peak-tflops 494.7) bf=(--precision bf16 --channels-last --peak-tflops 989)
      bench_run "a ember" "$ember" "${common[@]}" "${a[@]}"
      bench_run "a ember graphs" "$ember" "${common[@]}" "${a[@]}" --cuda-graphs
      bench_run "a torch" "${torch[@]}" "${common[@]}" "${a[@]}"
      bench_run "b ember" "$ember" "${common[@]}" "${bf[@]}"
      bench_run "b ember graphs" "$ember" "${common[@]}" "${bf[@]}" --cuda-graphs
      bench_run "b torch" "${torch[@]}" "${common[@]}" "${bf[@]}"
    done
  done
  # torch.compile last (tens of seconds to compile each), at the throughput batch.
  for model in resnet18 resnet20; do
    local common=(--device cuda --model "$model" --batch 512 --steps "$steps" --compile)
    bench_run "b torch compile" "${torch[@]}" "${common[@]}" --precision bf16 --channels-last --peak-tflops 989
    bench_run "a torch compile" "${torch[@]}" "${common[@]}" --precision tf32 --peak-tflops 494.7
  done
}

stage_gpt() {
  say "gpt: ember beside PyTorch eager, bf16"
  local sizes
  for sizes in "--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch 64" \
    "--n-layer 12 --n-head 12 --n-embd 768 --block-size 1024 --batch 8"; do
    # Eager with each CUDA attention kernel, then the whole step as one CUDA graph.
    # shellcheck disable=SC2086
    timeout "$run_timeout" bash bench/gpt_compare.sh --build "$b" --python python3 --device cuda \
      --precision bf16 --steps 10 --sdpa-kernels "tensor_core simple" $sizes \
      >>"$OUT/gpt.jsonl" 2>>"$OUT/bench.log"
    # shellcheck disable=SC2086
    timeout "$run_timeout" bash bench/gpt_compare.sh --build "$b" --python python3 --device cuda \
      --precision bf16 --steps 10 --ember-args --cuda-graphs $sizes \
      >>"$OUT/gpt.jsonl" 2>>"$OUT/bench.log"
  done
  say "gpt: $(grep -c ember_over_torch "$OUT/gpt.jsonl") comparisons"
}

stage_e2e() {
  local deb
  deb="$(ls "${FASHION_DEBS:-$debs}"/dataset-fashion-mnist_*.deb 2>/dev/null | head -1)"
  if [ -z "$deb" ]; then
    say "e2e: no dataset-fashion-mnist .deb in ${FASHION_DEBS:-$debs} (bash scripts/gpu_host.sh fetch-data DIR)"
    return 1
  fi
  local root=/tmp/ember-fashion epochs="${E2E_EPOCHS:-10}" device="${E2E_DEVICE:-cuda}"
  local extra=()
  read -r -a extra <<<"${E2E_EXTRA:-}"
  rm -rf "$root" && dpkg -x "$deb" "$root" || return 1
  local data="$root/usr/share/datasets/fashion-mnist"
  say "e2e: ember-train, ResNet-20 on Fashion-MNIST, $epochs epochs, bf16"
  local start=$SECONDS
  timeout "${STAGE_TIMEOUT_E2E:-240}" "$b/apps/ember-train" --device "$device" --precision bf16 \
    --epochs "$epochs" --data "$data" --workers 8 --out-dir /tmp/ember-e2e "${extra[@]}" \
    >"$OUT/e2e-ember.log" 2>&1
  local rc=$? seconds=$((SECONDS - start)) accuracy
  accuracy="$(grep -o 'final test accuracy [0-9.]*%' "$OUT/e2e-ember.log" | tail -1 | grep -o '[0-9.]*' | head -1)"
  printf '{"framework": "ember", "recipe": "resnet20 fashion-mnist onecycle", "precision": "bf16", "epochs": %s, "wall_s": %s, "final_test_accuracy": %s, "exit": %s}\n' \
    "$epochs" "$seconds" "$(python3 -c "print(${accuracy:-nan} / 100)" 2>/dev/null || echo null)" "$rc" >>"$OUT/e2e.jsonl"
  say "e2e: the same recipe in PyTorch"
  timeout "${STAGE_TIMEOUT_E2E:-240}" python3 bench/fashion_recipe_torch.py --data "$data" \
    --device "$device" --precision bf16 --epochs "$epochs" "${extra[@]}" 2>"$OUT/e2e-torch.log" |
    grep '^{' | tail -1 >>"$OUT/e2e.jsonl"
  cat "$OUT/e2e.jsonl"
}

# The table of bench.jsonl, for the end of the output.
bench_table() {
  python3 - "$OUT/bench.jsonl" <<'EOF'
import json, sys
print(f"{'row':17} {'model':9} {'batch':>5} {'ms/step':>8} {'img/s':>8} {'MFU':>6} {'peak MiB':>9}")
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "error" in r:
        print(f"{r['row']:17} {r['error']}: {r['command'][-60:]}")
        continue
    mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
    print(f"{r['row']:17} {r['model']:9} {r['batch']:>5} {r['ms_per_step']:>8.2f} "
          f"{r['images_per_s']:>8.0f} {mfu:>6} {r.get('peak_gpu_mem_mb', 0):>9.0f}")
EOF
}

status=0
for stage in "${stages[@]}"; do
  case "$stage" in
    build | test | gpt | bench | e2e) ;;
    *)
      say "unknown stage $stage (build, test, gpt, bench or e2e)"
      exit 2
      ;;
  esac
  start=$SECONDS
  if [ "$stage" = bench ]; then
    export -f bench_run say
    export OUT b steps run_timeout
    timeout "${STAGE_TIMEOUT_BENCH:-420}" bash -c "$(declare -f stage_bench); stage_bench"
  else
    "stage_$stage"
  fi
  rc=$?
  say "$stage: exit $rc after $((SECONDS - start)) s"
  [ $rc -ne 0 ] && status=1
  if [ "$stage" = build ] && [ $rc -ne 0 ]; then
    tail -30 "$OUT/build.log"
    break
  fi
done
[ -s "$OUT/bench.jsonl" ] && bench_table
[ -s "$OUT/gpt.jsonl" ] && cat "$OUT/gpt.jsonl"
exit $status

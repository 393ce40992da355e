#!/usr/bin/env bash
# ember's GPU session: built here, run there. The GPU machine (one H100 or H200, CUDA 13,
# PyTorch with its cuDNN and NCCL wheels, no network, about 15 minutes, at most 64 MiB of files
# in and 8 files back) never builds: it runs a bundle made beforehand on a development machine.
#
#   bash scripts/gpu_session.sh pack                 here: a Release build for sm_90 alone in
#                                                    build-pack/, then the bundle in .gpu/
#   OUT=DIR bash scripts/gpu_session.sh verify       there, with .gpu carried: the stages below,
#                                                    8 minutes at most, 7 files into OUT
#   bash scripts/gpu_session.sh verify --cpu-dry-run here: the same stages from a fresh unpacked
#                                                    copy, CUDA tests skipping, failing if any
#                                                    library resolves outside the bundle
#   OUT=DIR bash scripts/gpu_session.sh e2e FASHION_DEBS  there, when time is left: ember-train's
#                                                    default recipe beside PyTorch's (e2e.jsonl)
#   bash scripts/gpu_session.sh bundle BUILD DEST [--no-debs] [PROGRAM...]
#                                                    pack's second half alone: the bundle of a
#                                                    build folder (PROGRAMs: build-relative
#                                                    paths, default every test, bench and app)
#
# The bundle (.gpu/bundle.tar.xz, .gpu/manifest.json beside it): lib/ (ember's libraries),
# tests/ bench/ apps/ (the programs, stripped, RUNPATH $ORIGIN/../lib), tests/<module>/golden/
# (read through EMBER_TEST_DATA_DIR), tests/cuda_tests.txt (each test binary's CUDA tests as a
# gtest filter), debs/ (the runtime .deb files: scripts/gpu_host.sh's runtime list), and the
# manifest: commit, every file's size and hash, the hash of every tracked file of the tree.
#
# verify's stages, each under a hard cap (seconds: VERIFY_SECONDS total, default 470):
#   env        unpack into a fresh folder, refuse a bundle of another tree, unpack the .deb
#              files, cuDNN and NCCL from PyTorch's wheels; nvidia-smi and versions; every
#              library of every program resolved (ldd) and every test binary started: one that
#              cannot load stops the session here, its library or symbol in summary.json  60
#   tests      each test binary once, filtered to its CUDA tests; ember_dist_tests under
#              mpirun at 1 rank (NCCL at world size 1, MPI on CUDA tensors) and at 2 (MPI)  150
#   sanitizer  compute-sanitizer memcheck on the tensor tests' CUDA filter (small shapes;
#              summary.json counts the kernels under tensor/cuda/, not which of them ran),
#              racecheck on the attention and layer tests (the shared-memory kernels')       75
#   bench      beside PyTorch: attention kernels vs F.scaled_dot_product_attention, the GPT
#              step (6 x 384, batch 64; GPT-2 small, block 1024) per attention kernel and
#              captured, ResNet-20/18 at batch 128 and 512 in bf16 + channels_last (eager,
#              --cuda-graphs) and tf32, torch.compile last; a row whose kernels failed a test
#              is not run, a row past the time left is listed as cut                   the rest
# Files in OUT: summary.json (commit, device, versions, per-stage time, tests passed / failed /
# skipped with reasons, sanitizer findings, every ratio to PyTorch, rows cut), session.log,
# env.log, tests.log, sanitizer.log, bench.jsonl, bench.log.
#
# Environment: EMBER_PACK_BUILD_DIR (default build-pack), EMBER_BUNDLE (default .gpu),
# EMBER_VERIFY_DIR (verify's folder, default a fresh one under /tmp), VERIFY_SECONDS (default
# 470), BENCH_STEPS (default 20), E2E_EPOCHS (default 10), E2E_DEVICE (default cuda),
# E2E_EXTRA (flags both e2e sides take, e.g. "--max-steps 20"), STAGE_TIMEOUT_E2E (each side,
# default 240).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
bundle_dir="${EMBER_BUNDLE:-$repo/.gpu}"
helper="$here/gpu_bundle.py"
# shellcheck source=gpu_host.sh
source "$here/gpu_host.sh" ""

usage() {
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"
  exit 2
}

# --- here: pack and bundle -------------------------------------------------------------------

# ELF files alone (the build folders hold scripts and CMake's files beside the programs).
is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = "177ELF" ]; }

# The bundle of BUILD in DEST: DEST/bundle.tar.xz and DEST/manifest.json.
bundle() {
  local build="$1" dest="$2" debs=1
  shift 2
  local programs=()
  while (($#)); do
    case "$1" in
      --no-debs) debs=0 ;;
      *) programs+=("$1") ;;
    esac
    shift
  done
  build="$(cd "$build" && pwd)" || return 1
  if [ ${#programs[@]} -eq 0 ]; then
    local path
    for path in "$build"/tests/* "$build"/bench/* "$build"/apps/*; do
      [ -f "$path" ] && [ -x "$path" ] && is_elf "$path" && programs+=("${path#"$build"/}")
    done
  fi
  local staging="$dest.staging"
  rm -rf "$staging" && mkdir -p "$staging/lib" "$dest" || return 1
  local program lib
  for program in "${programs[@]}"; do
    mkdir -p "$staging/$(dirname "$program")"
    cp "$build/$program" "$staging/$program" || return 1
  done
  # ember's libraries under their soname, the one name the programs ask the loader for.
  for lib in "$build"/*/libember_*.so.[0-9]; do
    cp -L "$lib" "$staging/lib/" || return 1
  done
  strip --strip-unneeded "$staging"/lib/* "${programs[@]/#/$staging/}" || return 1
  # Relative RUNPATHs (CMake's own ELF editor: no patchelf needed); the programs sit one folder
  # below lib/.
  local rpaths="$staging/rpaths.cmake"
  {
    for lib in "$staging"/lib/*; do echo "file(RPATH_SET FILE \"$lib\" NEW_RPATH \"\$ORIGIN\")"; done
    for program in "${programs[@]}"; do
      echo "file(RPATH_SET FILE \"$staging/$program\" NEW_RPATH \"\$ORIGIN/../lib\")"
    done
  } >"$rpaths"
  cmake -P "$rpaths" >/dev/null && rm "$rpaths" || return 1
  # What the tests read: the golden data and the launcher script, under EMBER_TEST_DATA_DIR.
  (cd "$repo/tests" && find . -path '*/golden/*.json' -o -name torchrun_style.sh) |
    while read -r file; do
      mkdir -p "$staging/tests/$(dirname "$file")" && cp "$repo/tests/$file" "$staging/tests/$file"
    done
  python3 "$helper" cuda-tests "$repo/tests" >"$staging/tests/cuda_tests.txt" || return 1
  if ((debs)); then
    gpu_host_fetch_runtime "$staging/debs" >/dev/null || return 1
  fi
  local arch
  # A -DCMAKE_CUDA_ARCHITECTURES given wins over ember's own option (cmake/EmberCuda.cmake).
  arch="$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  [ -n "$arch" ] || arch="$(sed -n 's/^EMBER_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  python3 "$helper" manifest "$staging" "$repo" "${arch:-none}" || return 1
  cp "$staging/manifest.json" "$dest/manifest.json"
  tar -C "$staging" -cf - . | XZ_OPT="${XZ_OPT:--6 -T0}" xz >"$dest/bundle.tar.xz" || return 1
  rm -rf "$staging"
  echo "bundle: $dest/bundle.tar.xz, $(du -m "$dest/bundle.tar.xz" | cut -f1) MiB"
}

pack() {
  local build="${EMBER_PACK_BUILD_DIR:-$repo/build-pack}" start=$SECONDS
  # CI's flags (warnings as errors), so the C++ objects are ccache's hits of any CI-like build;
  # machine code for sm_90 alone (90-real: no PTX, no other architecture).
  cmake -S "$repo" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBER_CUDA=ON \
    -DEMBER_CUDA_ARCHITECTURES=90-real -DEMBER_WARNINGS_AS_ERRORS=ON >/dev/null || return 1
  cmake --build "$build" --parallel "${EMBER_JOBS:-$(nproc)}" || return 1
  local built=$SECONDS
  bundle "$build" "$bundle_dir" || return 1
  local tree
  tree="$(cd "$repo" && git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)"
  local bytes=$(($(du -b "$bundle_dir/bundle.tar.xz" | cut -f1) + $(du -b "$bundle_dir/manifest.json" | cut -f1)))
  echo "pack: build $((built - start)) s, bundle $((SECONDS - built)) s; bundle $((bytes / 1048576)) MiB" \
    "+ tracked tree $((tree / 1048576)) MiB = $(((bytes + tree) / 1048576)) MiB (limit 48)"
  if ((bytes + tree > 48 * 1048576)); then
    echo "pack: over 48 MiB: the call's 64 MiB would leave no room" >&2
    return 1
  fi
}

# --- there (or here, dry): verify --------------------------------------------------------------

say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/session.log"; }

# Merges KEY=VALUE pairs (VALUE as JSON where it parses, else a string) into stages/STAGE.json.
record() {
  local stage="$1"
  shift
  python3 - "$work/stages/$stage.json" "$@" <<'EOF'
import json, os, sys
path = sys.argv[1]
data = json.load(open(path)) if os.path.exists(path) else {}
for pair in sys.argv[2:]:
    key, _, value = pair.partition("=")
    try:
        data[key] = json.loads(value)
    except json.JSONDecodeError:
        data[key] = value
json.dump(data, open(path, "w"), indent=1)
EOF
}

# Runs a program of the bundle (or a script that starts them) with the bundle's libraries on
# the loader's path; everything else, PyTorch included, keeps the machine's environment. In a
# dry run the loader logs every object it loads, for the check that nothing came from outside.
ember() {
  if ((dry)); then
    LD_LIBRARY_PATH="$ember_ld_path" LD_DEBUG=files LD_DEBUG_OUTPUT="$work/lddebug/run" "$@"
  else
    LD_LIBRARY_PATH="$ember_ld_path" "$@"
  fi
}

stage_env() {
  local start=$SECONDS
  mkdir -p "$work/bundle" "$work/stages" "$work/gtest" "$work/lddebug"
  say "env: unpacking $bundle_dir/bundle.tar.xz into $work"
  # tar's xz, or python's where the machine has no xz.
  if ! timeout 60 tar -C "$work/bundle" -xJf "$bundle_dir/bundle.tar.xz" 2>>"$OUT/env.log" &&
    ! timeout 60 python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      "$bundle_dir/bundle.tar.xz" "$work/bundle"; then
    record env status=failed reason="cannot unpack $bundle_dir/bundle.tar.xz"
    return 1
  fi
  local check
  check="$(python3 "$helper" check "$b" "$repo")"
  local rc=$?
  record env commit="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' "$b/manifest.json")" \
    manifest_check="$check"
  if [ $rc -ne 0 ]; then
    say "env: refused: $check"
    record env status=failed reason="the bundle does not match this tree" seconds=$((SECONDS - start))
    return 1
  fi
  local saved_ld_path="${LD_LIBRARY_PATH:-}"
  export EMBER_DEB_ROOT="$work/debroot"
  if ! gpu_host_env "$b/debs" >>"$OUT/env.log" 2>&1; then
    record env status=failed reason="cannot unpack the .deb files" seconds=$((SECONDS - start))
    return 1
  fi
  ember_ld_path="$LD_LIBRARY_PATH:/usr/local/cuda/lib"
  if [ -n "$saved_ld_path" ]; then export LD_LIBRARY_PATH="$saved_ld_path"; else unset LD_LIBRARY_PATH; fi
  export EMBER_TEST_DATA_DIR="$b/tests" EMBER_TEST_BIN_DIR="$b/apps"
  # The python the compare scripts start: PyTorch's, with the machine's own libraries (the
  # bundle's would reach it through ember()'s path otherwise).
  printf '#!/bin/sh\n%s exec %q "$@"\n' \
    "$([ -n "$saved_ld_path" ] && printf 'LD_LIBRARY_PATH=%q' "$saved_ld_path" || echo 'unset LD_LIBRARY_PATH;')" \
    "$(command -v python3)" >"$work/python3"
  chmod +x "$work/python3"
  {
    echo "== nvidia-smi"
    timeout 20 nvidia-smi 2>&1 || echo "(no nvidia-smi: $? )"
    echo "== the bundle's programs run with LD_LIBRARY_PATH=$ember_ld_path"
  } >>"$OUT/env.log"
  local device versions
  device="$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  versions="$(timeout 60 "$work/python3" - <<'EOF' 2>>"$OUT/env.log"
import json
v = {}
try:
    import torch
    v = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
         "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
         "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None}
except Exception as e:
    v = {"torch": f"not importable: {e}"}
print(json.dumps(v))
EOF
)"
  [ -n "$versions" ] || versions='{}'
  record env device="${device:-none}" versions="$versions" mode="$mode"
  # Every ELF file of the bundle and of the unpacked packages, through the loader (ldd).
  # (45 s at most: what is left unchecked then is named.)
  local ldd_log="$work/ldd.log" file
  find "$b" "$EMBER_DEB_ROOT" -type f \( -perm -u+x -o -name '*.so*' \) | sort | while read -r file; do
    is_elf "$file" || continue
    if ((SECONDS - start > 45)); then
      echo "== $file"
      echo "	unchecked: the ldd check was cut at 45 s"
      continue
    fi
    echo "== ${file}"
    LD_LIBRARY_PATH="$ember_ld_path" timeout 10 ldd "$file" 2>&1
  done >"$ldd_log"
  local loads
  loads="$(python3 "$helper" loads "$work" "$ldd_log")"
  rc=$?
  echo "$loads" >>"$OUT/env.log"
  record env loads="$loads"
  # Each test binary started once (a missing symbol shows only then).
  local line binary failed=""
  while IFS=$'\t' read -r binary _; do
    [ -e "$b/tests/$binary" ] || continue  # a bundle of some programs alone (e2e's)
    if ! line="$(ember timeout 20 "$b/tests/$binary" --gtest_list_tests 2>&1 >/dev/null)"; then
      failed="$failed$binary: $(echo "$line" | grep -m1 -E 'error|undefined|not found' || echo "$line" | tail -1); "
    fi
  done <"$b/tests/cuda_tests.txt"
  if [ $rc -ne 0 ] || [ -n "$failed" ]; then
    say "env: a program cannot load: ${failed}$(echo "$loads" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("; ".join(d["unresolved"] + d["outside"])[:2000])')"
    record env status=failed reason="a program cannot load" cannot_start="${failed:-none}" \
      seconds=$((SECONDS - start))
    return 1
  fi
  record env status=passed seconds=$((SECONDS - start))
  say "env: ${device:-no GPU}; $(echo "$versions" | tr -d '{}"'); every library resolved"
}

stage_tests() {
  local start=$SECONDS cap="$1" binary filter pids=() rc
  local mpirun=(mpirun --allow-run-as-root --oversubscribe -np)
  while IFS=$'\t' read -r binary filter; do
    if [ ! -x "$b/tests/$binary" ]; then
      echo "[  FAILED  ] $binary.NotInTheBundle (0 ms)" >"$work/gtest/$binary.log"
      continue
    fi
    case "$binary" in
      ember_dist_tests)
        # NCCL refuses two ranks on one GPU: its tests run at one rank; MPI on CUDA at both.
        (
          ember timeout $((cap - 5)) "${mpirun[@]}" 1 "$b/tests/$binary" --gtest_filter="$filter" \
            --gtest_color=no >"$work/gtest/${binary}_np1.log" 2>&1
          ember timeout $((cap - 5 - (SECONDS - start))) "${mpirun[@]}" 2 "$b/tests/$binary" \
            --gtest_filter="$filter-*Nccl*" --gtest_color=no >"$work/gtest/${binary}_np2.log" 2>&1
        ) &
        ;;
      *)
        ember timeout $((cap - 5)) "$b/tests/$binary" --gtest_filter="$filter" --gtest_color=no \
          >"$work/gtest/$binary.log" 2>&1 &
        ;;
    esac
    pids+=($!)
  done <"$b/tests/cuda_tests.txt"
  wait "${pids[@]}"
  local log
  for log in "$work"/gtest/*.log; do
    echo "===== $(basename "$log" .log)"
    cat "$log"
  done >"$OUT/tests.log"
  local counts
  counts="$(python3 "$helper" gtest "$work"/gtest/*.log)"
  rc=$?
  record tests status="$([ $rc -eq 0 ] && echo passed || echo failed)" seconds=$((SECONDS - start)) \
    cap="$cap"
  say "tests: $counts"
  return $rc
}

# The tests that failed, one per line (for the benchmarks that depend on them).
failed_tests() {
  python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import gpu_bundle as g
r = g.parse_gtest(sys.argv[2:]); print("\n".join(r["failed"] + r["crashed"]))' "$here" "$work"/gtest/*.log
}

stage_sanitizer() {
  local start=$SECONDS cap="$1"
  local sanitizer
  sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
  local kernels
  kernels="$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["cuda_kernels"]))' "$b/manifest.json")"
  record sanitizer kernels_in_tensor_cuda="$kernels"
  if ((dry)); then
    record sanitizer status=not_run memcheck="not run: CPU dry run (no GPU)" \
      racecheck="not run: CPU dry run (no GPU)" seconds=0
    say "sanitizer: not run: CPU dry run"
    return 0
  fi
  if [ -z "$sanitizer" ]; then
    record sanitizer status=not_run memcheck="not run: no compute-sanitizer" \
      racecheck="not run: no compute-sanitizer" seconds=0
    say "sanitizer: not run: no compute-sanitizer (PATH or /usr/local/cuda/bin)"
    return 0
  fi
  # The tensor tests' CUDA filter but the allocator's out-of-memory test and the ResNet block's
  # steps (large, and no kernel of their own).
  local filter racefilter='AttentionTensorCore.CudaSmallShapesEveryVariant:LayersParity.*'
  filter="$(sed -n 's/^ember_tensor_tests\t//p' "$b/tests/cuda_tests.txt")-CachingAllocatorTest.*:AutocastResNetBlock.*"
  : >"$OUT/sanitizer.log"
  local tool status=passed
  for tool in memcheck racecheck; do
    local f="$filter" limit=$((cap * 3 / 5))
    [ "$tool" = racecheck ] && f="$racefilter" && limit=$((cap - (SECONDS - start) - 3))
    echo "===== $tool --gtest_filter=$f" >>"$OUT/sanitizer.log"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$sanitizer" --tool "$tool" --error-exitcode 9 \
      "$b/tests/ember_tensor_tests" --gtest_filter="$f" >"$work/$tool.log" 2>&1
    local rc=$?
    cat "$work/$tool.log" >>"$OUT/sanitizer.log"
    local findings verdict
    findings="$(grep -oE '(ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard)' "$work/$tool.log" | grep -oE '[0-9]+' | tail -1)"
    if grep -qE 'Device not supported|Unable to find injection|error 999' "$work/$tool.log"; then
      verdict="not run: compute-sanitizer refused the device ($(grep -m1 -E 'Device not supported|Unable to find|error 999' "$work/$tool.log"))"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      verdict="ran: cut at its cap of $limit s, ${findings:-0} findings so far"
    else
      verdict="ran: ${findings:-0} findings in $((SECONDS - t0)) s (exit $rc)"
    fi
    [ "${findings:-0}" != 0 ] && status=failed
    record sanitizer "$tool=$verdict"
    say "sanitizer $tool: $verdict"
  done
  record sanitizer status="$status" seconds=$((SECONDS - start))
}

# One benchmark row: LABEL GROUP SIDE SECONDS NEEDS -- COMMAND... Not run where a test it
# NEEDS (a regular expression over test names, "" for none) failed, cut where it would outrun
# the stage; else every JSON line it prints goes to bench.jsonl with its row, group and side.
row() {
  local label="$1" group="$2" side="$3" estimate="$4" needs="$5"
  shift 6
  local broken=""
  [ -n "$needs" ] && broken="$(grep -E "$needs" "$work/failed_tests" | head -3 | tr '\n' ' ')"
  if [ -n "$broken" ]; then
    printf '{"row": "%s", "not_run": "depends on failed tests: %s"}\n' "$label" "$broken" >>"$work/bench.jsonl"
    return
  fi
  if ((SECONDS + estimate > bench_deadline)); then
    printf '{"row": "%s", "cut": "time: needs about %s s, %s s left"}\n' "$label" "$estimate" \
      "$((bench_deadline - SECONDS))" >>"$work/bench.jsonl"
    return
  fi
  local out rc
  out="$(ember timeout $((bench_deadline - SECONDS)) "$@" 2>>"$OUT/bench.log")"
  rc=$?
  printf '%s: %s -> exit %s\n%s\n' "$label" "$*" "$rc" "$out" >>"$OUT/bench.log"
  local json found=0
  while read -r json; do
    [[ "$json" == "{"* ]] || continue
    found=1
    printf '{"row": "%s", "group": "%s", "side": "%s", %s\n' "$label" "$group" "$side" "${json#\{}" >>"$work/bench.jsonl"
  done <<<"$out"
  if [ $rc -ne 0 ] || [ $found -eq 0 ]; then
    printf '{"row": "%s", "error": "exit %s"}\n' "$label" "$rc" >>"$work/bench.jsonl"
  fi
}

stage_bench() {
  local start=$SECONDS
  local steps="${BENCH_STEPS:-20}" torch=("$work/python3" "$repo/bench/train_step_torch.py")
  local step="$b/bench/train_step" py="$work/python3"
  : >"$work/bench.jsonl"
  failed_tests >"$work/failed_tests"
  if ((dry)); then
    # The GPU rows say why they did not run; one small CPU row proves the plumbing.
    row "plumbing: ember train_step cpu" resnet20-cpu ember 60 "" -- \
      "$step" --device cpu --model resnet20 --batch 8 --steps 2 --threads 2
    if "$py" -c 'import torch' 2>/dev/null; then
      row "plumbing: torch train_step cpu" resnet20-cpu torch 60 "" -- \
        "${torch[@]}" --device cpu --model resnet20 --batch 8 --steps 2 --threads 2
    else
      echo '{"row": "plumbing: torch train_step cpu", "not_run": "no PyTorch on this machine"}' >>"$work/bench.jsonl"
    fi
    local label
    for label in "attention kernels beside sdpa" "gpt 6x384 per kernel" "gpt 6x384 captured" \
      "resnet bf16 channels_last" "resnet tf32" "gpt2-small per kernel" "gpt2-small captured" \
      "torch.compile"; do
      printf '{"row": "%s", "not_run": "CPU dry run: a GPU benchmark"}\n' "$label" >>"$work/bench.jsonl"
    done
  else
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader >>"$OUT/bench.log" 2>&1
    local attention='Attention|LayersParity|CudaParity' convs='CudaParity|LayersParity|ChannelsLast|Cuda\.'
    local graphs='CudaGraph|Capturable'
    local small="--n-layer 6 --n-head 6 --n-embd 384 --block-size 256 --batch 64"
    local gpt2="--n-layer 12 --n-head 12 --n-embd 768 --block-size 1024 --batch 8"
    local compare=(bash "$repo/bench/gpt_compare.sh" --build "$b" --python "$py" --device cuda
      --precision bf16 --steps 10)
    row "attention kernels beside sdpa" attention ember 40 "$attention" -- \
      bash "$repo/bench/attention_compare.sh" --build "$b" --python "$py"
    # shellcheck disable=SC2086
    row "gpt 6x384 per kernel" gpt-6x384 ember 35 "$attention" -- "${compare[@]}" \
      --sdpa-kernels "tensor_core simple" $small
    # shellcheck disable=SC2086
    row "gpt 6x384 captured" gpt-6x384 ember 25 "$attention|$graphs" -- "${compare[@]}" \
      --ember-args --cuda-graphs $small
    # bf16 + channels_last first, then tf32 (NCHW); the peaks are the H100 SXM's dense ones.
    local kind model batch bf=(--precision bf16 --channels-last --peak-tflops 989)
    for kind in bf16-cl tf32; do
      local flags=("${bf[@]}")
      [ "$kind" = tf32 ] && flags=(--precision tf32 --peak-tflops 494.7)
      for model in resnet20 resnet18; do
        for batch in 128 512; do
          local common=(--device cuda --model "$model" --batch "$batch" --steps "$steps")
          local g="$model b$batch $kind"
          row "$g ember" "$g" ember 10 "$convs" -- "$step" "${common[@]}" "${flags[@]}"
          row "$g ember graphs" "$g" ember-graphs 10 "$convs|$graphs" -- "$step" "${common[@]}" \
            "${flags[@]}" --cuda-graphs
          row "$g torch" "$g" torch 15 "" -- "${torch[@]}" "${common[@]}" "${flags[@]}"
        done
      done
    done
    # shellcheck disable=SC2086
    row "gpt2-small per kernel" gpt2-small ember 60 "$attention" -- "${compare[@]}" \
      --sdpa-kernels "tensor_core simple" $gpt2
    # shellcheck disable=SC2086
    row "gpt2-small captured" gpt2-small ember 40 "$attention|$graphs" -- "${compare[@]}" \
      --ember-args --cuda-graphs $gpt2
    for model in resnet20 resnet18; do
      local g="$model b512 bf16-cl"
      row "$g torch compile" "$g" torch-compile 90 "" -- "${torch[@]}" --device cuda --model "$model" \
        --batch 512 --steps "$steps" "${bf[@]}" --compile
    done
  fi
  cp "$work/bench.jsonl" "$OUT/bench.jsonl"
  local errors
  errors="$(grep -c '"error"' "$work/bench.jsonl")"
  record bench status="$([ "$errors" = 0 ] && echo passed || echo failed)" seconds=$((SECONDS - start))
  say "bench: $(grep -c '"group"' "$work/bench.jsonl") lines, $errors rows failed (bench.log)," \
    "$(grep -c '"cut"' "$work/bench.jsonl") rows cut, $(grep -c '"not_run"' "$work/bench.jsonl") not run"
  [ "$errors" = 0 ]
}

# The dry run's proof: every object a bundle program loaded came from the bundle, the
# machine's CUDA or its C/C++ runtime.
stage_loads() {
  local start=$SECONDS loads rc
  loads="$(python3 "$helper" loads "$work" "$work/ldd.log" "$work/lddebug")"
  rc=$?
  echo "$loads" >>"$OUT/env.log"
  record loads loaded="$loads" status="$([ $rc -eq 0 ] && echo passed || echo failed)" \
    seconds=$((SECONDS - start))
  say "loads: $(echo "$loads" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["checked"], "files through ldd,", d.get("loaded_at_run_time"), "objects loaded at run time;", len(d["outside"]), "outside the bundle,", len(d["unresolved"]), "unresolved")')"
  return $rc
}

verify() {
  dry=0
  mode=gpu
  if [ "${1:-}" = --cpu-dry-run ]; then
    dry=1
    mode=cpu-dry-run
  elif [ -n "${1:-}" ]; then
    usage
  fi
  if [ ! -f "$bundle_dir/bundle.tar.xz" ]; then
    echo "verify: no $bundle_dir/bundle.tar.xz (bash scripts/gpu_session.sh pack, then carry .gpu)" >&2
    return 2
  fi
  # The dry run's own mount namespace (as root): the machine's Open MPI, PMIx and UCX plugin
  # folders, which those libraries open by compiled-in paths, hidden behind empty ones.
  if ((dry)) && [ -z "${EMBER_DRY_RUN_NAMESPACE:-}" ] && [ "$(id -u)" = 0 ] &&
    unshare -m true 2>/dev/null; then
    EMBER_DRY_RUN_NAMESPACE=1 exec unshare -m bash "${BASH_SOURCE[0]}" verify --cpu-dry-run
  fi
  local hidden=() folder
  if [ -n "${EMBER_DRY_RUN_NAMESPACE:-}" ]; then
    for folder in /usr/lib/x86_64-linux-gnu/{openmpi,pmix2,ucx}; do
      [ -d "$folder" ] && mount -t tmpfs none "$folder" && hidden+=("$folder")
    done
  fi
  work="${EMBER_VERIFY_DIR:-$(mktemp -d /tmp/ember-verify.XXXXXX)}"
  if [ -z "${OUT:-}" ]; then
    ((dry)) || usage
    OUT="$work/out"
  fi
  mkdir -p "$OUT" "$work/stages"
  ((dry)) && record env hidden_system_folders="$(printf '%s\n' "${hidden[@]}" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read().split()))')"
  b="$work/bundle"
  local total="${VERIFY_SECONDS:-470}" status=0
  local deadline=$((SECONDS + total))
  say "verify ($mode): $work, $total s at most"
  if stage_env; then
    stage_tests "$(((deadline - SECONDS) < 150 ? deadline - SECONDS : 150))" || status=1
    stage_sanitizer 75 || status=1
    bench_deadline=$((deadline - 15))
    stage_bench || status=1
    if ((dry)); then stage_loads || status=1; fi
  else
    status=1
  fi
  python3 "$helper" summary "$OUT" "$work" | tee -a "$OUT/session.log"
  [ "${PIPESTATUS[0]}" -ne 0 ] && status=1
  say "verify: exit $status after $SECONDS s; files in $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
  return $status
}

# ember-train's default recipe (ResNet-20 on Fashion-MNIST, E2E_EPOCHS epochs, bf16,
# channels_last) beside bench/fashion_recipe_torch.py: wall time and final test accuracy.
e2e() {
  local debs="${1:-}"
  local deb
  deb="$(ls "$debs"/dataset-fashion-mnist_*.deb 2>/dev/null | head -1)"
  if [ -z "$deb" ]; then
    echo "e2e: no dataset-fashion-mnist .deb in '$debs' (bash scripts/gpu_host.sh fetch-data DIR)" >&2
    return 2
  fi
  [ -n "${OUT:-}" ] || usage
  dry=0 mode=e2e
  work="${EMBER_VERIFY_DIR:-$(mktemp -d /tmp/ember-verify.XXXXXX)}"
  mkdir -p "$OUT" "$work/stages"
  b="$work/bundle"
  stage_env || return 1
  local root="$work/fashion" epochs="${E2E_EPOCHS:-10}" device="${E2E_DEVICE:-cuda}" extra=()
  read -r -a extra <<<"${E2E_EXTRA:-}"
  dpkg -x "$deb" "$root" || return 1
  local data="$root/usr/share/datasets/fashion-mnist"
  say "e2e: ember-train, ResNet-20 on Fashion-MNIST, $epochs epochs, bf16"
  local start=$SECONDS
  ember timeout "${STAGE_TIMEOUT_E2E:-240}" "$b/apps/ember-train" --device "$device" --precision bf16 \
    --epochs "$epochs" --data "$data" --workers 8 --out-dir "$work/e2e" "${extra[@]}" \
    >"$OUT/e2e-ember.log" 2>&1
  local rc=$? seconds=$((SECONDS - start)) accuracy
  accuracy="$(grep -o 'final test accuracy [0-9.]*%' "$OUT/e2e-ember.log" | tail -1 | grep -o '[0-9.]*' | head -1)"
  printf '{"framework": "ember", "recipe": "resnet20 fashion-mnist onecycle", "precision": "bf16", "epochs": %s, "wall_s": %s, "final_test_accuracy": %s, "exit": %s}\n' \
    "$epochs" "$seconds" "$(python3 -c "print(${accuracy:-float('nan')} / 100)")" "$rc" >>"$OUT/e2e.jsonl"
  say "e2e: the same recipe in PyTorch"
  timeout "${STAGE_TIMEOUT_E2E:-240}" "$work/python3" "$repo/bench/fashion_recipe_torch.py" \
    --data "$data" --device "$device" --precision bf16 --epochs "$epochs" "${extra[@]}" \
    2>"$OUT/e2e-torch.log" | grep '^{' | tail -1 >>"$OUT/e2e.jsonl"
  cat "$OUT/e2e.jsonl"
}

command="${1:-}"
shift || true
case "$command" in
  pack) pack ;;
  bundle)
    [ $# -ge 2 ] || usage
    bundle "$@"
    ;;
  verify) verify "$@" ;;
  e2e) e2e "$@" ;;
  *) usage ;;
esac

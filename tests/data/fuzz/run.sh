#!/usr/bin/env bash
# Builds ember's libFuzzer harnesses (idx, CIFAR, image decoding) with Debian's clang, under
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs each for a bounded time from
# seeds of valid files it generates. Exits non-zero when any harness finds a crash, a leak,
# undefined behaviour, an exception other than ember::Error, a hang (-timeout) or an
# allocation past -malloc_limit_mb; the input that did it is left in OUT_DIR/crashes/.
#
#   bash tests/data/fuzz/run.sh OUT_DIR SECONDS_EACH
#
# Needs clang and libclang-rt-14-dev (libFuzzer and the sanitizer runtimes), libpng-dev,
# libjpeg62-turbo-dev and zlib1g-dev (scripts/setup.sh installs them). The harnesses compile
# the readers' sources directly (data/io.cpp, data/image_decode.cpp), not the ember libraries.
# Environment: EMBER_FUZZ_CXX (default clang++), EMBER_FUZZ_JOBS (harnesses run at once,
# default 1).
set -euo pipefail

if (($# != 2)); then
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
out="$1"
seconds="$2"
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cxx="${EMBER_FUZZ_CXX:-clang++}"
fuzzers=(idx cifar image)

mkdir -p "$out/include/ember" "$out/obj" "$out/crashes"
out="$(cd "$out" && pwd)"
ln -sfn "$repo/data" "$out/include/ember/data"
ln -sfn "$repo/tensor" "$out/include/ember/tensor"

flags=(-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined
  -fno-sanitize-recover=all -I"$out/include")
echo "run.sh: building with $cxx"
for src in io image_decode; do
  "$cxx" "${flags[@]}" -fsanitize=fuzzer-no-link -c "$repo/data/$src.cpp" -o "$out/obj/$src.o"
done
for f in "${fuzzers[@]}"; do
  "$cxx" "${flags[@]}" -fsanitize=fuzzer "$repo/tests/data/fuzz/${f}_fuzzer.cpp" \
    "$out/obj/io.o" "$out/obj/image_decode.o" -lpng -ljpeg -lz -o "$out/${f}_fuzzer"
done

status=0
run_one() {
  local f="$1"
  mkdir -p "$out/corpus/$f"
  # -rss_limit_mb and -malloc_limit_mb bound memory (an allocation the input's size cannot
  # justify is a finding), -timeout bounds one input's time.
  "$out/${f}_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -malloc_limit_mb=1024 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$out/crashes/$f-" "$out/corpus/$f" >"$out/$f.log" 2>&1
}
jobs_max="${EMBER_FUZZ_JOBS:-1}"
declare -A pids=()
for f in "${fuzzers[@]}"; do
  echo "run.sh: fuzzing $f for ${seconds}s"
  run_one "$f" &
  pids[$f]=$!
  while (($(jobs -rp | wc -l) >= jobs_max)); do sleep 1; done
done
for f in "${fuzzers[@]}"; do
  if wait "${pids[$f]}"; then
    echo "run.sh: $f: $(grep -E '^stat::number_of_executed_units' "$out/$f.log" | awk '{print $2}') inputs, no crash"
  else
    echo "run.sh: $f FAILED; the end of $out/$f.log:" >&2
    tail -n 40 "$out/$f.log" >&2
    status=1
  fi
done
if ((status != 0)); then
  echo "run.sh: inputs that failed are in $out/crashes/:" >&2
  ls -l "$out/crashes" >&2
fi
exit "$status"

#!/usr/bin/env bash
# Runs the emulated CUDA suite (tests/tensor/cuda_emulated/, built with gcov instrumentation:
# EMBER_CUDA_EMULATED_COVERAGE, on by default) and fails when a __global__ kernel under
# tensor/cuda/ runs in none of its tests, unless tests/tensor/cuda_emulated/not_yet_emulated.txt
# lists it (and fails when a listed kernel does run or names no kernel: the list only shrinks
# and stays true). Reports the gcov line coverage of each tensor/cuda/ source by the suite.
#
#   bash scripts/check_emulated_coverage.sh [build_dir]     (default: build, or $EMBER_BUILD_DIR)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-${EMBER_BUILD_DIR:-build}}"
[[ "$build_dir" = /* ]] || build_dir="$repo_root/$build_dir"
binary="$build_dir/tests/ember_cuda_emulated_tests"
objects="$build_dir/tests/CMakeFiles/ember_cuda_emulated_tests.dir"
if [[ ! -x "$binary" ]]; then
  echo "check_emulated_coverage.sh: no $binary (build the target ember_cuda_emulated_tests)" >&2
  exit 1
fi
if ! find "$objects" -name '*.gcno' | grep -q .; then
  echo "check_emulated_coverage.sh: $binary is not instrumented" \
    "(configure with -DEMBER_CUDA_EMULATED_COVERAGE=ON)" >&2
  exit 1
fi

find "$objects" -name '*.gcda' -delete
"$binary" --gtest_brief=1 >/dev/null

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# One JSON document per translation unit (gcov -j -t), lines and functions of every source.
find "$objects" -name '*.gcda' | while read -r gcda; do
  (cd "$work" && gcov -j -t -o "$(dirname "$gcda")" "$gcda" 2>/dev/null) >>"$work/gcov.jsonl"
done

python3 - "$repo_root" "$work/gcov.jsonl" <<'PY'
import json, os, re, sys

root, report = sys.argv[1], sys.argv[2]
cuda = os.path.join(root, "tensor", "cuda")

def ours(path):
    """The tensor/cuda/ source a gcov file entry names, relative to the repo, or None."""
    path = os.path.realpath(path)
    if not path.startswith(cuda + os.sep) or os.sep + "emulated" + os.sep in path:
        return None
    return os.path.relpath(path, root)

lines = {}  # source -> {line: executed?}
with open(report) as f:
    for text in f:
        text = text.strip()
        if not text:
            continue
        doc = json.loads(text)
        cwd = doc.get("current_working_directory", "")
        for entry in doc["files"]:
            source = ours(os.path.join(cwd, entry["file"]))
            if source is None:
                continue
            seen = lines.setdefault(source, {})
            for line in entry["lines"]:
                seen[line["line_number"]] = seen.get(line["line_number"], False) or line["count"] > 0

# Every __global__ kernel: its file, name and the lines of its body (the braces after it).
kernel_re = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(")
kernels = []
for name in sorted(os.listdir(cuda)):
    if name.endswith((".cu", ".cuh")):
        text = open(os.path.join(cuda, name)).read()
        for m in kernel_re.finditer(text):
            open_brace = text.index("{", m.end())
            depth, i = 0, open_brace
            while True:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                if depth == 0:
                    break
                i += 1
            body = range(text.count("\n", 0, open_brace) + 1, text.count("\n", 0, i) + 2)
            kernels.append((os.path.join("tensor", "cuda", name), m.group(1), body))

listed = set()
allow = os.path.join(root, "tests", "tensor", "cuda_emulated", "not_yet_emulated.txt")
if os.path.exists(allow):
    for text in open(allow):
        text = text.split("#")[0].strip()
        if text:
            listed.add(text)

failed = False
covered = 0
for source, kernel, body in kernels:
    key = f"{source}:{kernel}"
    ran = any(lines.get(source, {}).get(line, False) for line in body)
    covered += ran
    if not ran and key not in listed:
        print(f"no emulated test runs {key}")
        failed = True
    if ran and key in listed:
        print(f"{key} runs emulated now: take it off {os.path.relpath(allow, root)}")
        failed = True

# A listed kernel that no longer exists there (moved, renamed, removed) is an error too.
for key in sorted(listed - {f"{k[0]}:{k[1]}" for k in kernels}):
    print(f"{key} names no __global__ kernel: take it off {os.path.relpath(allow, root)}")
    failed = True

print(f"emulated CUDA kernels: {covered} of {len(kernels)} run in tests/tensor/cuda_emulated/")
total = hit = 0
for source in sorted(lines):
    n, h = len(lines[source]), sum(lines[source].values())
    total, hit = total + n, hit + h
    print(f"  {source}: {h}/{n} lines ({100.0 * h / max(n, 1):.1f}%)")
emulated = {s for s in lines}
for source in sorted({k[0] for k in kernels} - emulated):
    print(f"  {source}: not compiled into the emulated suite")
print(f"line coverage of tensor/cuda/ by the emulated suite: {hit}/{total} "
      f"({100.0 * hit / max(total, 1):.1f}%) of the lines gcov counts in the files it compiles")
sys.exit(1 if failed else 0)
PY

#!/usr/bin/env bash
# The GPU bundle's plumbing on a small CPU-only pack (scripts/gpu_session.sh bundle): ember's
# libraries and ember_optim_tests, unpacked into another folder, run from there with every
# ember library resolved inside it (RUNPATH relative, none absolute) and the golden data read
# through EMBER_TEST_DATA_DIR; the manifest lists every file with its size and hash, names this
# tree's commit, and refuses a changed bundle file or another tree.
#
#   bash tests/pack/pack_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
source_dir="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "pack_test: FAILED: $*" >&2
  exit 1
}

# Fastest compression: the test checks the plumbing, not the size.
XZ_OPT="-0 -T0" EMBER_BUNDLE="$tmp/pack" bash "$source_dir/scripts/gpu_session.sh" bundle "$build" \
  "$tmp/pack" --no-debs tests/ember_optim_tests
moved="$tmp/elsewhere/bundle"
mkdir -p "$moved"
tar -C "$moved" -xJf "$tmp/pack/bundle.tar.xz"

# The manifest: this tree's commit, every file with its size, and nothing else in the bundle.
python3 - "$moved" "$(git -C "$source_dir" rev-parse HEAD)" <<'EOF' || fail "manifest"
import json, os, sys
bundle, head = sys.argv[1], sys.argv[2]
m = json.load(open(os.path.join(bundle, "manifest.json")))
assert m["commit"] == head, (m["commit"], head)
on_disk = {os.path.relpath(os.path.join(r, n), bundle) for r, _, ns in os.walk(bundle) for n in ns}
assert on_disk - {"manifest.json"} == set(m["files"]), on_disk ^ set(m["files"])
for path, f in m["files"].items():
    assert os.path.getsize(os.path.join(bundle, path)) == f["size"], path
assert m["bytes"] == sum(f["size"] for f in m["files"].values())
assert "tests/ember_optim_tests" in m["files"] and "lib/libember_tensor.so.0" in m["files"]
assert "tests/optim/golden/grad_scaler_golden.json" in m["files"]
assert "scripts/gpu_session.sh" in m["sources"]
print(f"manifest: {len(m['files'])} files, {m['bytes']} bytes, commit {m['commit'][:12]}")
EOF
python3 "$source_dir/scripts/gpu_bundle.py" check "$moved" "$source_dir" >/dev/null ||
  fail "check refused the bundle it was made with"

# Relocatable: no absolute RUNPATH, and every ember library found inside the moved copy.
for file in "$moved"/lib/* "$moved"/tests/ember_optim_tests; do
  runpath="$(readelf -d "$file" | sed -n 's/.*R\(UN\)\{0,1\}PATH.*\[\(.*\)\]/\2/p')"
  [[ "$runpath" == '$ORIGIN'* && "$runpath" != *:/* ]] || fail "$file has RUNPATH '$runpath'"
done
ldd "$moved/tests/ember_optim_tests" | grep libember_ >"$tmp/ldd.txt"
[ "$(wc -l <"$tmp/ldd.txt")" -ge 4 ] || fail "ember libraries missing from ldd: $(cat "$tmp/ldd.txt")"
if grep -v "=> $moved/" "$tmp/ldd.txt"; then fail "an ember library resolves outside the bundle"; fi

# Runs from there, reading the golden data from the bundle; an empty data folder fails it (the
# variable is what the test reads).
filter='GradScaler.MatchesPyTorch*:GradScaler.UnscaleThenClipMatchesPyTorch'
(cd "$tmp/elsewhere" && EMBER_TEST_DATA_DIR="$moved/tests" bundle/tests/ember_optim_tests \
  --gtest_filter="$filter" --gtest_brief=1) || fail "the moved test binary"
mkdir "$tmp/empty"
if EMBER_TEST_DATA_DIR="$tmp/empty" "$moved/tests/ember_optim_tests" --gtest_filter="$filter" \
  >"$tmp/empty.log" 2>&1; then
  fail "ran with no golden data: EMBER_TEST_DATA_DIR is not what the test reads"
fi
grep -q "cannot open $tmp/empty/optim/golden/grad_scaler_golden.json" "$tmp/empty.log" ||
  fail "the missing golden file is not named: $(tail -5 "$tmp/empty.log")"

# Refusals: a changed bundle file, and a tree that is not the one packed.
echo tampered >>"$moved/tests/optim/golden/grad_scaler_golden.json"
python3 "$source_dir/scripts/gpu_bundle.py" check "$moved" "$source_dir" >"$tmp/check.json" &&
  fail "check accepted a changed bundle file"
grep -q "bundle file differs: tests/optim/golden/grad_scaler_golden.json" "$tmp/check.json" ||
  fail "the changed file is not named: $(cat "$tmp/check.json")"
python3 "$source_dir/scripts/gpu_bundle.py" check "$moved" "$tmp/empty" >"$tmp/check.json" &&
  fail "check accepted another tree"
grep -q "the tree is not the one packed" "$tmp/check.json" || fail "$(cat "$tmp/check.json")"
echo "pack_test: the moved pack runs, resolves inside itself and its manifest checks out"

#!/usr/bin/env bash
# Runs a command that must fail: passes when it exits non-zero within MAX_SECONDS and its
# output matches REGEX (grep -E), and every further REGEX given with --and.
# Usage: expect_failure.sh MAX_SECONDS REGEX [--and REGEX]... command...
set -u
max_seconds=$1
regexes=("$2")
shift 2
while [ "${1:-}" = "--and" ]; do
  regexes+=("$2")
  shift 2
done
start=$(date +%s)
output=$("$@" 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$output"
echo "--- exit status ${status} after ${elapsed} s"
if [ "$status" -eq 0 ]; then echo "FAIL: expected a non-zero exit status"; exit 1; fi
if [ "$elapsed" -gt "$max_seconds" ]; then echo "FAIL: took more than ${max_seconds} s"; exit 1; fi
for regex in "${regexes[@]}"; do
  if ! printf '%s\n' "$output" | grep -Eq -- "$regex"; then echo "FAIL: output does not match: $regex"; exit 1; fi
done
echo "PASS"

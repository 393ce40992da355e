#!/usr/bin/env bash
# Runs a job that must fail with its flight-recorder dumps going to DIR (emptied first), then
# ember-flight on DIR; prints both and exits with the job's status (0 stays 0, so
# expect_failure.sh catches a job that did not fail).
#   flight_job.sh DIR EMBER_FLIGHT_BIN command...
set -u
dir=$1
flight=$2
shift 2
rm -rf "$dir"
mkdir -p "$dir"
EMBER_FLIGHT_DIR=$dir "$@"
status=$?
echo "--- the job exited with status ${status}; ember-flight ${dir}:"
"$flight" "$dir"
exit "$status"

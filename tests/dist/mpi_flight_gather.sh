#!/usr/bin/env bash
# An mpirun job whose ranks write their flight records to folders of their own, DIR/r<R> (as on
# nodes without a shared folder): afterwards rank 0's folder must hold every rank's dump,
# gathered over the job's store, and ember-flight reads it there. Prints the job's output,
# which dumps each folder holds ("DIR/rA holds rankB.json"), and ember-flight's paragraph;
# exits with the job's status (0 stays 0, so expect_failure.sh catches a job that did not fail).
#   mpi_flight_gather.sh DIR EMBER_FLIGHT_BIN NP MPIRUN... -- PROGRAM ARGS...
# (each rank runs `mpi_flight_gather.sh --rank DIR PROGRAM ARGS...`, which picks its folder)
set -u
if [ "$1" = "--rank" ]; then
  export EMBER_FLIGHT_DIR="$2/r${OMPI_COMM_WORLD_RANK:?not started by mpirun}"
  shift 2
  exec "$@"
fi
dir=$1
flight=$2
np=$3
shift 3
mpirun=()
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do
  mpirun+=("$1")
  shift
done
shift
rm -rf "$dir"
mkdir -p "$dir"
"${mpirun[@]}" bash "$0" --rank "$dir" "$@"
status=$?
for ((a = 0; a < np; a++)); do
  for ((b = 0; b < np; b++)); do
    if [ -f "$dir/r$a/rank$b.json" ]; then echo "r$a holds rank$b.json"; fi
  done
done
echo "--- the job exited with status ${status}; ember-flight ${dir}/r0:"
"$flight" "$dir/r0"
exit "$status"

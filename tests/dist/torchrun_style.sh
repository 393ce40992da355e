#!/usr/bin/env bash
# Starts N copies of a command torchrun-style on this host, without mpirun: each gets RANK,
# WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1 and MASTER_PORT (a port nothing uses now).
# Exits 0 when every copy does. As soon as one fails the others are stopped and its status is
# returned; every copy is also stopped after TORCHRUN_STYLE_TIMEOUT seconds (default 240, inside
# ctest's 300, so the script's own message shows), so the launch never hangs.
# TORCHRUN_STYLE_PORT, when set, is the MASTER_PORT to use (a test that talks to the job too).
#   torchrun_style.sh N command [args...]
set -u
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: torchrun_style.sh N command [args...]" >&2
  exit 2
fi
n=$1
shift
limit=${TORCHRUN_STYLE_TIMEOUT:-240}

# A port no socket on this host uses (listening or connected), from /proc/net/tcp{,6}.
port_in_use() {
  local hex
  hex=$(printf ':%04X ' "$1")
  grep -qi -- "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
port=${TORCHRUN_STYLE_PORT:-}
if [ -z "$port" ]; then
  port=$((20000 + RANDOM % 40000))
  while port_in_use "$port"; do port=$((20000 + RANDOM % 40000)); done
fi

# The copies must see this launcher only, not an mpirun or Slurm job around it.
unset OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK
unset SLURM_PROCID SLURM_NTASKS SLURM_LOCALID

pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 1
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
}
trap 'stop_all; exit 143' TERM INT

for ((rank = 0; rank < n; ++rank)); do
  RANK=$rank WORLD_SIZE=$n LOCAL_RANK=$rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    timeout -k 5 "$limit" "$@" &
  pids+=($!)
done

status=0
running=("${pids[@]}")
while [ "${#running[@]}" -gt 0 ]; do
  still=()
  for pid in "${running[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      still+=("$pid")
      continue
    fi
    wait "$pid"
    code=$?
    if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
      status=$code
      for ((rank = 0; rank < n; ++rank)); do
        if [ "${pids[$rank]}" = "$pid" ]; then
          echo "torchrun_style.sh: rank $rank exited with status $code; stopping the others" >&2
        fi
      done
      stop_all
    fi
  done
  running=("${still[@]}")
  if [ "${#running[@]}" -gt 0 ]; then sleep 0.1; fi
done
exit "$status"

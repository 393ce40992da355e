#!/usr/bin/env bash
# A live TCP job (ranks started torchrun-style) tried as a cluster's network would try it.
#   store_strangers.sh fuzz NP STRANGER_MAIN
#     The job (barriers, collectives, DDP steps) runs once undisturbed, then again while a
#     stranger holds 200 idle connections to rank 0's store and sends it random bytes,
#     truncated requests and huge announced lengths. Checks: the results are the same, rank
#     0's peak RSS is within 100 MB of the undisturbed run's, every rank exits within 2 s of
#     its last collective, and rank 0 logged the dropped connections by address.
#   store_strangers.sh secret NP STRANGER_MAIN
#     The job runs with a job secret (EMBER_JOB_SECRET) while an intruder tries forged set
#     and add requests with a wrong secret and with none. Checks: the job completes with the
#     undisturbed run's results, every intruder attempt is refused and logged by address, and
#     no forged key reached the store.
# KEEP=1 keeps the work folder (logs, each run's results) for a look afterwards.
set -u
if [ $# -ne 3 ]; then
  echo "usage: store_strangers.sh fuzz|secret NP STRANGER_MAIN" >&2
  exit 2
fi
mode=$1
np=$2
bin=$3
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
fail() {
  echo "store_strangers.sh $mode $np: $*" >&2
  for f in "$work"/*.log; do
    [ -f "$f" ] && { echo "--- $f" >&2; tail -20 "$f" >&2; }
  done
  exit 1
}

port_in_use() {
  grep -qi -- "$(printf ':%04X ' "$1")" /proc/net/tcp /proc/net/tcp6 2>/dev/null
}
free_port() {
  local port=$((20000 + RANDOM % 40000))
  while port_in_use "$port"; do port=$((20000 + RANDOM % 40000)); done
  echo "$port"
}

# run_job DIR [env assignments...]: the job at NP ranks on a fresh port (in $port); each rank
# writes its exit time (ns) to DIR/exit_RANK.
run_job() {
  local dir=$1
  shift
  mkdir -p "$dir"
  env "$@" TORCHRUN_STYLE_PORT="$port" TORCHRUN_STYLE_TIMEOUT=120 \
    bash "$here/torchrun_style.sh" "$np" bash -c \
    '"$0" job "$1"; rc=$?; date +%s%N > "$1/exit_$RANK"; exit $rc' "$bin" "$dir" \
    2> "$dir.log"
}

port=$(free_port)
run_job "$work/quiet" || fail "the undisturbed job failed"

port=$(free_port)
if [ "$mode" = fuzz ]; then
  "$bin" fuzz "$port" 8 2> "$work/stranger.log" &
  stranger=$!
  run_job "$work/loud" || fail "the job failed while a stranger was at its store"
  wait "$stranger" || fail "the stranger failed"
elif [ "$mode" = secret ]; then
  secret=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')
  "$bin" intruder "$port" "$work/intruder_done" 2> "$work/stranger.log" &
  stranger=$!
  run_job "$work/loud" EMBER_JOB_SECRET="$secret" EMBER_STRANGER_WAIT_FILE="$work/intruder_done" ||
    fail "the job with a secret failed"
  wait "$stranger" || fail "the intruder was served: $(grep served "$work/stranger.log")"
  [ "$(cat "$work/loud/forged_0")" = absent ] || fail "a forged request changed a key"
  grep -q "refused" "$work/stranger.log" || fail "the intruder saw no refusal"
else
  fail "unknown mode $mode"
fi

for ((rank = 0; rank < np; ++rank)); do
  cmp -s "$work/quiet/rank$rank.txt" "$work/loud/rank$rank.txt" ||
    fail "rank $rank's results differ from the undisturbed run's"
done
grep -q "tcp_store on port $port: dropped the connection from 127.0.0.1:" "$work/loud.log" ||
  fail "rank 0 logged no dropped connection"

if [ "$mode" = fuzz ]; then
  quiet_hwm=$(cat "$work/quiet/hwm_0")
  loud_hwm=$(cat "$work/loud/hwm_0")
  echo "rank 0 peak RSS: ${quiet_hwm} KiB undisturbed, ${loud_hwm} KiB with the stranger"
  [ $((loud_hwm - quiet_hwm)) -lt 102400 ] || fail "rank 0's peak RSS grew by more than 100 MB"
  for ((rank = 0; rank < np; ++rank)); do
    last=$(cat "$work/loud/last_collective_$rank")
    gone=$(cat "$work/loud/exit_$rank")
    ms=$(((gone - last) / 1000000))
    echo "rank $rank exited $ms ms after its last collective"
    [ "$ms" -lt 2000 ] || fail "rank $rank exited $ms ms after its last collective"
  done
  grep "stranger:" "$work/stranger.log"
else
  cat "$work/stranger.log"
  grep "dropped" "$work/loud.log"
fi
grep -c "dropped" "$work/loud.log" | sed 's/^/connections rank 0 dropped and logged: /'
echo "store_strangers.sh $mode $np: ok"

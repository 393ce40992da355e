#!/usr/bin/env bash
# ember-run as users start it (see launch_tests.cmake), with launch_worker_main.cpp's worker:
#   launch_tests.sh CASE EMBER_RUN LAUNCH_WORKER [EMBER_TRAIN]
# CASE: local2, local3 (one node), nodes (two launchers on loopback), nodes_secret_required,
# nodes_wrong_secret, nodes_bad_program, node_launcher_killed,
# restart (SIGKILL under --max-restarts 1: bit-identical final parameters), restart_nodes,
# fail, fail_nodes (no restarts: every launcher exits non-zero naming the dead rank), sigterm,
# sigint (forwarded: the workers end, ember-run exits 128 + the signal),
# launcher_killed (SIGKILL to ember-run: its workers die too), secret, train (ember-train under ember-run; exits 77 without Fashion-MNIST),
# threads (OMP_NUM_THREADS and ember's thread count as each worker sees them),
# elastic (--nnodes 1:2: a node stopped mid-run is dropped by heartbeat, the job goes on alone
# from its snapshot, a node started later joins), elastic_master_lost (the master launcher's
# node stopped: the other gives up within the heartbeat timeout), elastic_leave (SIGTERM takes
# a node out; a launcher arriving with no restarts left is refused), elastic_bad_program (a
# launcher that cannot start its program leaves), elastic_spare (a launcher
# that finds the round full waits), elastic_args (refusals).
# Every launcher runs under `timeout`, so no case can hang; each case takes seconds.
set -u
case_name=$1
run=$2
worker=$3
train=${4:-}
work=$(mktemp -d "${TMPDIR:-/tmp}/ember_launch_${case_name}_XXXXXX")
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL ($case_name): $*"
  for log in "$work"/*.log; do
    [ -f "$log" ] && { echo "--- $log"; cat "$log"; }
  done
  exit 1
}
# A loopback port nothing uses now.
free_port() {
  local port hex
  while :; do
    port=$((20000 + RANDOM % 40000))
    hex=$(printf ':%04X ' "$port")
    grep -qi -- "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null || break
  done
  echo "$port"
}
# Every pid written by the workers to $1/pid* must be gone (reaped, not a zombie).
expect_workers_gone() {
  local f pid
  for f in "$1"/pid*; do
    [ -f "$f" ] || fail "no pid file in $1"
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then fail "worker $pid ($f) outlived ember-run"; fi
  done
}
# Waits up to 30 s for the files given.
wait_files() {
  local i f missing
  for ((i = 0; i < 300; ++i)); do
    missing=0
    for f in "$@"; do [ -e "$f" ] || missing=1; done
    [ "$missing" -eq 0 ] && return 0
    sleep 0.1
  done
  fail "timed out waiting for $*"
}
# Two launchers on loopback as node 0 and node 1 (2 workers each); their statuses in
# $status0 / $status1 and output in node0.log / node1.log.
two_nodes() {
  local port
  port=$(free_port)
  timeout -k 5 90 "$run" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" \
    --nproc-per-node 2 --rdzv-timeout 30 "$@" >"$work/node0.log" 2>&1 &
  local pid0=$!
  timeout -k 5 90 "$run" --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" \
    --nproc-per-node 2 --rdzv-timeout 30 "$@" >"$work/node1.log" 2>&1 &
  local pid1=$!
  wait "$pid0"
  status0=$?
  wait "$pid1"
  status1=$?
}
# Waits up to 30 s until the command given succeeds.
wait_until() {
  local i
  for ((i = 0; i < 300; ++i)); do
    "$@" && return 0
    sleep 0.1
  done
  fail "timed out waiting for: $*"
}
# The worker's step file reads "round R world W step S": true when it is at least $1, $2, $3.
at_step() {
  local line
  line=$(cat "$work/job/step" 2>/dev/null) || return 1
  read -r _ r _ w _ s <<<"$line"
  [ "$r" -ge "$1" ] && [ "$w" -eq "$2" ] && [ "$s" -ge "$3" ]
}
now() { date +%s.%N; }
# Elastic launchers with the ember-run arguments given: A, the master (a.log, $pid_a), then B
# (b.log, $pid_b).
elastic_pair() {
  timeout -k 5 80 "$run" "$@" >"$work/a.log" 2>&1 &
  pid_a=$!
  wait_until grep -qs "serving the launchers' store" "$work/a.log"
  timeout -k 5 80 "$run" "$@" >"$work/b.log" 2>&1 &
  pid_b=$!
}
# The launcher a `timeout ... ember-run` job started as $1, and its workers.
launcher_of() { pgrep -P "$1" -x ember-run || echo "$1"; }
shared_secret() {
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret")
  export EMBER_JOB_SECRET_FILE="$work/secret"
}
unset EMBER_JOB_SECRET EMBER_JOB_SECRET_FILE RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT

case "$case_name" in
local2 | local3)
  n=${case_name#local}
  mkdir -p "$work/job"
  # a descriptor ember-run inherits (fd 7 here) must not reach the workers
  timeout -k 5 60 "$run" --nproc-per-node "$n" "$worker" check "$work/job" >"$work/run.log" 2>&1 \
    7<"$0" || fail "ember-run exited with $?"
  sum=$((n * (n + 1) / 2))
  gathered=$((n * (n - 1) / 2))
  secret=""
  for ((r = 0; r < n; ++r)); do
    line=$(cat "$work/job/rank$r.txt") || fail "rank $r wrote nothing"
    [[ $line == "rank $r local $r world $n local_world $n node 0 restart 0 sum $sum gathered $gathered fds 0 secret /"* ]] ||
      fail "rank $r: $line"
    this=${line##* secret }
    [ -z "$secret" ] || [ "$secret" = "$this" ] || fail "ranks got different secrets"
    secret=$this
  done
  [ ! -e "$secret" ] || fail "the job secret $secret was not removed"
  ;;
nodes)
  shared_secret
  mkdir -p "$work/job"
  two_nodes "$worker" check "$work/job"
  [ "$status0" -eq 0 ] && [ "$status1" -eq 0 ] || fail "launchers exited with $status0, $status1"
  for r in 0 1 2 3; do
    line=$(cat "$work/job/rank$r.txt") || fail "rank $r wrote nothing"
    expected="rank $r local $((r % 2)) world 4 local_world 2 node $((r / 2)) restart 0 sum 10 gathered 6 fds 0 secret $work/secret"
    [ "$line" = "$expected" ] || fail "rank $r: $line"
  done
  ;;
nodes_secret_required)
  out=$("$run" --nnodes 2 --node-rank 0 --nproc-per-node 1 "$worker" check "$work" 2>&1)
  status=$?
  [ "$status" -ne 0 ] || fail "ember-run --nnodes 2 ran without a job secret"
  grep -q "needs the same job secret on every node" <<<"$out" || fail "message: $out"
  # --no-secret: the job runs, without one
  mkdir -p "$work/job"
  two_nodes --no-secret "$worker" check "$work/job"
  [ "$status0" -eq 0 ] && [ "$status1" -eq 0 ] || fail "launchers exited with $status0, $status1"
  grep -q "secret none$" "$work/job/rank3.txt" || fail "rank 3: $(cat "$work/job/rank3.txt")"
  ;;
nodes_wrong_secret)
  # node 1 holds another secret: node 0's launcher store refuses it, and both give up
  shared_secret
  port=$(free_port)
  start=$(date +%s)
  timeout -k 5 60 "$run" --nnodes 2 --node-rank 0 --master-port "$port" --nproc-per-node 1 \
    --rdzv-timeout 4 "$worker" check "$work" >"$work/node0.log" 2>&1 &
  pid0=$!
  echo "not the job's secret" >"$work/other"
  chmod 600 "$work/other"
  EMBER_JOB_SECRET_FILE="$work/other" timeout -k 5 60 "$run" --nnodes 2 --node-rank 1 \
    --master-port "$port" --nproc-per-node 1 --rdzv-timeout 4 "$worker" check "$work" \
    >"$work/node1.log" 2>&1
  status1=$?
  wait "$pid0"
  status0=$?
  elapsed=$(($(date +%s) - start))
  [ "$status0" -ne 0 ] && [ "$status1" -ne 0 ] || fail "launchers exited with $status0, $status1"
  [ "$elapsed" -le 20 ] || fail "took $elapsed s"
  grep -q "job secret" "$work/node1.log" || fail "node 1 does not say its secret was refused"
  ! ls "$work"/rank*.txt >/dev/null 2>&1 || fail "a worker ran"
  ;;
nodes_bad_program)
  # node 1 cannot start its program: node 0 stops too, long before any timeout
  shared_secret
  port=$(free_port)
  start=$(date +%s)
  timeout -k 5 60 "$run" --nnodes 2 --node-rank 0 --master-port "$port" --nproc-per-node 1 \
    "$worker" wait "$work" >"$work/node0.log" 2>&1 &
  pid0=$!
  timeout -k 5 60 "$run" --nnodes 2 --node-rank 1 --master-port "$port" --nproc-per-node 1 \
    "$work/no-such-program" >"$work/node1.log" 2>&1
  status1=$?
  wait "$pid0"
  status0=$?
  elapsed=$(($(date +%s) - start))
  [ "$status0" -ne 0 ] && [ "$status1" -ne 0 ] || fail "launchers exited with $status0, $status1"
  [ "$elapsed" -le 10 ] || fail "took $elapsed s"
  grep -q "the launcher of node 1 failed: launch: cannot run $work/no-such-program" \
    "$work/node0.log" || fail "node 0 does not name node 1's failure"
  ;;
node_launcher_killed)
  # SIGKILL to node 1's ember-run: its workers die with it, node 0's fail at their next
  # collective, and node 0 gives up after --rdzv-timeout (3 s) without an answer from node 1
  shared_secret
  port=$(free_port)
  timeout -k 5 60 "$run" --nnodes 2 --node-rank 0 --master-port "$port" --nproc-per-node 2 \
    --rdzv-timeout 3 "$worker" wait "$work" >"$work/node0.log" 2>&1 &
  pid0=$!
  timeout -k 5 60 "$run" --nnodes 2 --node-rank 1 --master-port "$port" --nproc-per-node 2 \
    --rdzv-timeout 3 "$worker" wait "$work" >"$work/node1.log" 2>&1 &
  pid1=$!
  wait_files "$work/ready0" "$work/ready1" "$work/ready2" "$work/ready3"
  kill -KILL "$(pgrep -P "$pid1" -x ember-run || echo "$pid1")"
  wait "$pid1"
  sleep 0.5
  start=$(date +%s)
  touch "$work/stop"
  wait "$pid0"
  status0=$?
  elapsed=$(($(date +%s) - start))
  [ "$status0" -ne 0 ] || fail "node 0 exited with 0"
  [ "$elapsed" -le 10 ] || fail "took $elapsed s"
  grep -q "the job failed: rank [01] (local rank [01] on node 0.*(1 of 2 launchers did not answer" \
    "$work/node0.log" || fail "node 0 does not report its failure and node 1's silence"
  expect_workers_gone "$work"
  ;;
restart)
  mkdir -p "$work/ref" "$work/killed"
  timeout -k 5 60 "$run" --nproc-per-node 2 "$worker" train "$work/ref" 8 >"$work/ref.log" 2>&1 ||
    fail "the uninterrupted run failed"
  timeout -k 5 60 "$run" --nproc-per-node 2 --max-restarts 1 "$worker" train "$work/killed" 8 1 4 \
    >"$work/killed.log" 2>&1 || fail "the run with a restart failed"
  grep -q "rank 1 (local rank 1 on node 0, pid [0-9]*) was killed by signal 9 (SIGKILL)" \
    "$work/killed.log" || fail "no SIGKILL reported"
  grep -q "restarting the workers (restart 1 of 1)" "$work/killed.log" || fail "no restart"
  [ "$(cat "$work/killed/resumed0")" = 4 ] && [ "$(cat "$work/killed/resumed1")" = 4 ] ||
    fail "the restarted workers did not resume from the step 4 snapshot"
  cmp "$work/ref/final.bin" "$work/killed/final.bin" ||
    fail "final parameters differ from the uninterrupted run's"
  ;;
restart_nodes)
  shared_secret
  mkdir -p "$work/ref" "$work/killed"
  timeout -k 5 60 "$run" --nproc-per-node 4 "$worker" train "$work/ref" 8 >"$work/ref.log" 2>&1 ||
    fail "the uninterrupted run failed"
  two_nodes --max-restarts 1 "$worker" train "$work/killed" 8 3 4
  [ "$status0" -eq 0 ] && [ "$status1" -eq 0 ] || fail "launchers exited with $status0, $status1"
  # node 0's own workers may fail first (rank 3 closed its connection); the cause named is
  # still rank 3's death
  for node in 0 1; do
    grep -q "restarting the workers (restart 1 of 1) after: rank 3 (local rank 1 on node 1, pid [0-9]*) was killed by signal 9" \
      "$work/node$node.log" || fail "node $node did not restart for rank 3's death"
  done
  for r in 0 1 2 3; do
    [ "$(cat "$work/killed/resumed$r")" = 4 ] || fail "rank $r did not resume at step 4"
  done
  cmp "$work/ref/final.bin" "$work/killed/final.bin" ||
    fail "final parameters differ from the uninterrupted run's"
  ;;
fail)
  start=$(date +%s)
  timeout -k 5 60 "$run" --nproc-per-node 3 --grace 2 "$worker" die "$work" 1 >"$work/run.log" 2>&1
  status=$?
  elapsed=$(($(date +%s) - start))
  [ "$status" -eq 137 ] || fail "ember-run exited with $status, not 137 (128 + SIGKILL)"
  [ "$elapsed" -le 20 ] || fail "took $elapsed s"
  grep -q "the job failed: rank 1 (local rank 1 on node 0, pid [0-9]*) was killed by signal 9" \
    "$work/run.log" || fail "the message does not name rank 1"
  expect_workers_gone "$work"
  ;;
fail_nodes)
  shared_secret
  start=$(date +%s)
  two_nodes --grace 2 "$worker" die "$work" 3
  elapsed=$(($(date +%s) - start))
  [ "$status0" -ne 0 ] && [ "$status1" -ne 0 ] || fail "launchers exited with $status0, $status1"
  [ "$elapsed" -le 30 ] || fail "took $elapsed s"
  for node in 0 1; do
    grep -q "the job failed: rank 3 (local rank 1 on node 1, pid [0-9]*) was killed by signal 9" \
      "$work/node$node.log" || fail "node $node's message does not name rank 3"
  done
  expect_workers_gone "$work"
  ;;
sigterm | sigint)
  sig=${case_name#sig}
  sig=${sig^^}
  code=143
  [ "$sig" = INT ] && code=130
  # the grace (5 s) is longer than the test allows: the workers must end on the signal itself
  timeout -k 5 60 "$run" --nproc-per-node 2 --grace 5 "$worker" wait "$work" >"$work/run.log" 2>&1 &
  launcher=$!
  wait_files "$work/ready0" "$work/ready1"
  secret=$(cat "$work/ready0")
  [ -e "$secret" ] || fail "no secret file while the job runs"
  start=$(date +%s)
  kill -"$sig" "$(pgrep -P "$launcher" -x ember-run || echo "$launcher")"
  wait "$launcher"
  status=$?
  elapsed=$(($(date +%s) - start))
  [ "$status" -eq "$code" ] || fail "ember-run exited with $status, not $code (128 + SIG$sig)"
  [ "$elapsed" -le 3 ] || fail "took $elapsed s"
  grep -q "got SIG$sig; forwarding it to the workers" "$work/run.log" || fail "no forwarding"
  expect_workers_gone "$work"
  [ ! -e "$secret" ] || fail "the job secret $secret was not removed"
  ;;
launcher_killed)
  # SIGKILL cannot be forwarded: the workers die with their launcher (PR_SET_PDEATHSIG)
  timeout -k 5 60 "$run" --nproc-per-node 2 "$worker" wait "$work" >"$work/run.log" 2>&1 &
  launcher=$!
  wait_files "$work/ready0" "$work/ready1"
  kill -KILL "$(pgrep -P "$launcher" -x ember-run || echo "$launcher")"
  wait "$launcher"
  for ((i = 0; i < 50; ++i)); do
    alive=0
    for f in "$work"/pid*; do kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
    [ "$alive" -eq 0 ] && break
    sleep 0.1
  done
  expect_workers_gone "$work"
  ;;
secret)
  port=$(free_port)
  timeout -k 5 60 "$run" --nproc-per-node 2 --master-port "$port" "$worker" wait "$work" \
    >"$work/run.log" 2>&1 &
  launcher=$!
  wait_files "$work/ready0" "$work/ready1"
  secret=$(cat "$work/ready0")
  [ "$secret" = "$(cat "$work/ready1")" ] || fail "the workers got different secrets"
  [ "$(stat -c %a "$secret")" = 600 ] || fail "$secret is not mode 600"
  [ "$(stat -c %a "$(dirname "$secret")")" = 700 ] || fail "its folder is not mode 700"
  "$worker" client "$port" none >"$work/none.log" 2>&1
  [ $? -eq 3 ] || fail "a client without the secret was served"
  echo wrong >"$work/wrong"
  "$worker" client "$port" "$work/wrong" >"$work/wrong.log" 2>&1
  [ $? -eq 3 ] || fail "a client with a wrong secret was served"
  "$worker" client "$port" "$secret" >"$work/right.log" 2>&1 || fail "the right secret was refused"
  touch "$work/stop"
  wait "$launcher" || fail "the job failed"
  ;;
threads)
  # Unless the user set OMP_NUM_THREADS, each worker gets its share of the CPUs of ember-run's
  # affinity mask (at least 1), ember's thread count follows it, and ember-run says so once.
  unset OMP_NUM_THREADS OMP_THREAD_LIMIT
  cpus=$(nproc) # the affinity mask's CPUs
  expect_threads() { # DIR WORKERS OMP_NUM_THREADS THREADS
    local r line
    for ((r = 0; r < $2; ++r)); do
      line=$(cat "$1/threads$r.txt") || fail "rank $r wrote nothing"
      [ "$line" = "omp_num_threads $3 threads $4" ] || fail "rank $r of $2: $line (expected $3, $4)"
    done
  }
  for n in 1 2 3; do
    share=$((cpus / n > 0 ? cpus / n : 1))
    mkdir -p "$work/job$n"
    timeout -k 5 60 "$run" --nproc-per-node "$n" "$worker" threads "$work/job$n" \
      >"$work/run$n.log" 2>&1 || fail "ember-run exited with $?"
    expect_threads "$work/job$n" "$n" "$share" "$share"
    [ "$(grep -c "setting OMP_NUM_THREADS=$share for each worker: its share of the $cpus CPUs" \
      "$work/run$n.log")" = 1 ] || fail "ember-run did not say OMP_NUM_THREADS=$share once"
  done
  # a narrower mask (taskset -c 0) is what ember-run shares
  if [ "$cpus" -ge 2 ] && command -v taskset >/dev/null; then
    mkdir -p "$work/one"
    timeout -k 5 60 taskset -c "$(taskset -pc $$ | sed 's/.*: //; s/[,-].*//')" "$run" \
      --nproc-per-node 1 "$worker" threads "$work/one" >"$work/one.log" 2>&1 ||
      fail "ember-run under taskset exited with $?"
    expect_threads "$work/one" 1 1 1
  fi
  # the user's OMP_NUM_THREADS is kept, silently
  mkdir -p "$work/user"
  OMP_NUM_THREADS=3 timeout -k 5 60 "$run" --nproc-per-node 2 "$worker" threads "$work/user" \
    >"$work/user.log" 2>&1 || fail "ember-run exited with $?"
  expect_threads "$work/user" 2 3 3
  ! grep -q "setting OMP_NUM_THREADS" "$work/user.log" || fail "the user's OMP_NUM_THREADS was overridden"
  ;;
train)
  if [ ! -d /usr/share/datasets/fashion-mnist ]; then
    echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)"
    exit 77
  fi
  timeout -k 5 240 "$run" --nproc-per-node 2 "$train" --device cpu --threads 1 --workers 0 \
    --batch-size 32 --max-steps 4 --epochs 1 --out-dir "$work/out" >"$work/train.log" 2>&1 ||
    fail "ember-train under ember-run exited with $?"
  grep -q " 2 rank(s) on cpu (tcp)" "$work/train.log" || fail "not 2 ranks over TCP"
  grep -q "^done: 4 steps" "$work/train.log" || fail "did not finish 4 steps"
  test -s "$work/out/metrics.jsonl" || fail "no metrics"
  ;;
elastic)
  # --nnodes 1:2, one worker per node: A serves the store, B joins; B's launcher and worker
  # are stopped (SIGSTOP) mid-run: A drops B within the heartbeat timeout (the workers' own
  # collective timeout is 60 s), restarts its worker alone (world 1) from the snapshot; C,
  # started then, joins at the next round (world 2) and the job finishes; B, continued, finds
  # itself dropped and exits.
  shared_secret
  mkdir -p "$work/job"
  port=$(free_port)
  hb=2
  args=(--nnodes 1:2 --master-port "$port" --nproc-per-node 1 --max-restarts 3
    --heartbeat-timeout "$hb" --rdzv-last-call 2 --grace 1 --rdzv-timeout 30
    "$worker" elastic "$work/job" 60 100)
  elastic_pair "${args[@]}"
  wait_until at_step 0 2 3
  launcher_b=$(launcher_of "$pid_b")
  workers_b=$(pgrep -P "$launcher_b")
  kill -STOP "$launcher_b" $workers_b
  stopped=$(now)
  wait_until grep -q "was lost: no heartbeat for $hb s" "$work/a.log"
  noticed=$(awk -v a="$stopped" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  awk -v t="$noticed" -v hb="$hb" 'BEGIN { exit !(t <= hb + 1.5) }' ||
    fail "B's loss was noticed after $noticed s (heartbeat timeout $hb s)"
  wait_until test -e "$work/job/round1.rank0"
  timeout -k 5 80 "$run" "${args[@]}" >"$work/c.log" 2>&1 &
  pid_c=$!
  kill -CONT "$launcher_b" $workers_b
  wait "$pid_b"
  status_b=$?
  wait "$pid_a"
  status_a=$?
  wait "$pid_c"
  status_c=$?
  [ "$status_a" -eq 0 ] && [ "$status_c" -eq 0 ] || fail "A and C exited with $status_a, $status_c"
  [ "$status_b" -ne 0 ] || fail "B, dropped, exited with 0"
  grep -q "was dropped from the job: the master launcher saw no heartbeat" "$work/b.log" ||
    fail "B does not say it was dropped"
  for pid in $workers_b; do kill -0 "$pid" 2>/dev/null && fail "B's worker $pid outlived it"; done
  grep -q "restarting the workers (restart 1 of 3) after: the launcher joined as #1 (pid [0-9]* on .*) was lost" \
    "$work/a.log" || fail "A did not restart for B's loss"
  grep -q "restarting the workers (restart 2 of 3) after: the launcher joined as #2 (pid [0-9]* on .*) asks to join" \
    "$work/a.log" || fail "A did not restart for C's arrival"
  grep -q "node 1, round 2: started ranks 1..1 of 2" "$work/c.log" || fail "C is not node 1 of round 2"
  for r in 0 1; do
    grep -q "^world 2 resumed -1$" "$work/job/round0.rank$r" || fail "round 0, rank $r: $(cat "$work/job/round0.rank$r")"
  done
  read -r _ w1 _ resumed1 <"$work/job/round1.rank0"
  [ "$w1" = 1 ] && [ "$resumed1" -ge 3 ] || fail "round 1: world $w1 resumed at $resumed1"
  [ ! -e "$work/job/round1.rank1" ] || fail "round 1 has a second rank"
  for r in 0 1; do
    read -r _ w2 _ resumed2 <"$work/job/round2.rank$r"
    [ "$w2" = 2 ] && [ "$resumed2" -ge "$resumed1" ] || fail "round 2, rank $r: world $w2 resumed at $resumed2"
  done
  [ "$(cat "$work/job/final.txt")" = "step 60 world 2" ] || fail "final: $(cat "$work/job/final.txt")"
  echo "B's loss noticed after $noticed s (heartbeat timeout $hb s); round 1 resumed at step $resumed1, round 2 at $resumed2"
  ;;
elastic_leave)
  # --max-restarts 1: SIGTERM to B's launcher takes its node out; A goes on alone from the
  # snapshot (the one restart) and finishes; C, arriving with no restarts left, is refused.
  shared_secret
  mkdir -p "$work/job"
  port=$(free_port)
  args=(--nnodes 1:2 --master-port "$port" --nproc-per-node 1 --max-restarts 1
    --heartbeat-timeout 2 --rdzv-last-call 2 --grace 1 --rdzv-timeout 30
    "$worker" elastic "$work/job" 50 100)
  elastic_pair "${args[@]}"
  wait_until at_step 0 2 3
  kill -TERM "$(launcher_of "$pid_b")"
  wait "$pid_b"
  status_b=$?
  [ "$status_b" -eq 143 ] || fail "B exited with $status_b, not 143 (128 + SIGTERM)"
  wait_until test -e "$work/job/round1.rank0"
  timeout -k 5 30 "$run" "${args[@]}" >"$work/c.log" 2>&1
  status_c=$?
  wait "$pid_a"
  status_a=$?
  [ "$status_a" -eq 0 ] || fail "A exited with $status_a"
  [ "$status_c" -ne 0 ] || fail "C, with no restarts left, exited with 0"
  grep -q "the job has no restarts left (--max-restarts 1) to start a round that admits this launcher" \
    "$work/c.log" || fail "C does not say why it was refused"
  grep -q "restarting the workers (restart 1 of 1) after: the launcher of node 1 was stopped by SIGTERM, which takes its node out of the job" \
    "$work/a.log" || fail "A does not name B's leaving"
  read -r _ w1 _ resumed1 <"$work/job/round1.rank0"
  [ "$w1" = 1 ] && [ "$resumed1" -ge 3 ] || fail "round 1: world $w1 resumed at $resumed1"
  [ ! -e "$work/job/round2.rank0" ] || fail "a round 2 ran"
  [ "$(cat "$work/job/final.txt")" = "step 50 world 1" ] || fail "final: $(cat "$work/job/final.txt")"
  ;;
elastic_bad_program)
  # B cannot start its program: it leaves, and A goes on alone (its one restart) to the end.
  shared_secret
  mkdir -p "$work/job"
  port=$(free_port)
  opts=(--nnodes 1:2 --master-port "$port" --nproc-per-node 1 --max-restarts 1
    --heartbeat-timeout 2 --rdzv-last-call 2 --rdzv-timeout 30)
  timeout -k 5 60 "$run" "${opts[@]}" "$worker" elastic "$work/job" 20 50 >"$work/a.log" 2>&1 &
  pid_a=$!
  wait_until grep -qs "serving the launchers' store" "$work/a.log"
  timeout -k 5 60 "$run" "${opts[@]}" "$work/no-such-program" >"$work/b.log" 2>&1
  status_b=$?
  wait "$pid_a"
  status_a=$?
  [ "$status_a" -eq 0 ] && [ "$status_b" -ne 0 ] || fail "launchers exited with $status_a, $status_b"
  grep -q "restarting the workers (restart 1 of 1) after: the launcher of node 1 failed: launch: cannot run $work/no-such-program" \
    "$work/a.log" || fail "A does not name B's failure"
  [ "$(cat "$work/job/final.txt")" = "step 20 world 1" ] || fail "final: $(cat "$work/job/final.txt")"
  ;;
elastic_spare)
  # --nnodes 1:1: a second launcher finds the round full and waits as a spare; when the job
  # finishes it says so and exits 0.
  shared_secret
  mkdir -p "$work/job"
  port=$(free_port)
  args=(--nnodes 1:1 --master-port "$port" --nproc-per-node 1 --rdzv-timeout 30
    "$worker" elastic "$work/job" 20 100)
  elastic_pair "${args[@]}"
  wait "$pid_a"
  status_a=$?
  wait "$pid_b"
  status_b=$?
  [ "$status_a" -eq 0 ] && [ "$status_b" -eq 0 ] || fail "launchers exited with $status_a, $status_b"
  grep -q "the job runs (round 0: 1 of at most 1 nodes): waiting as a spare for a place" \
    "$work/b.log" || fail "B does not say it waits as a spare"
  grep -q "the job finished before this launcher got a place in it" "$work/b.log" ||
    fail "B does not say the job finished without it"
  [ "$(cat "$work/job/final.txt")" = "step 20 world 1" ] || fail "final: $(cat "$work/job/final.txt")"
  ;;
elastic_master_lost)
  # The store lives in the master launcher: its node stopped, the other launcher gives up
  # within the heartbeat timeout, saying why, and stops its workers.
  shared_secret
  port=$(free_port)
  hb=2
  args=(--nnodes 1:2 --master-port "$port" --nproc-per-node 1 --heartbeat-timeout "$hb"
    --grace 1 --rdzv-timeout 30 "$worker" wait "$work")
  elastic_pair "${args[@]}"
  wait_files "$work/ready0" "$work/ready1"
  launcher_a=$(launcher_of "$pid_a")
  workers_a=$(pgrep -P "$launcher_a")
  kill -STOP "$launcher_a" $workers_a
  stopped=$(now)
  wait "$pid_b"
  status_b=$?
  took=$(awk -v a="$stopped" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
  kill -KILL "$launcher_a" $workers_a
  wait "$pid_a"
  [ "$status_b" -ne 0 ] || fail "B exited with 0"
  awk -v t="$took" -v hb="$hb" 'BEGIN { exit !(t <= hb + 3) }' ||
    fail "B gave up after $took s (heartbeat timeout $hb s)"
  grep -q "served by the master launcher, stopped answering.*single point of failure" \
    "$work/b.log" || fail "B does not say the master's store is gone"
  pid=$(cat "$work/pid1")
  ! kill -0 "$pid" 2>/dev/null || fail "B's worker $pid outlived it"
  echo "B gave up $took s after the master's node stopped (heartbeat timeout $hb s)"
  ;;
elastic_args)
  expect_refused() { # MESSAGE ARGS...
    local message=$1 out
    shift
    out=$(timeout -k 5 30 "$run" "$@" "$worker" check "$work" 2>&1) && fail "ran: $*"
    grep -q -- "$message" <<<"$out" || fail "ember-run $*: $out"
  }
  expect_refused "--nnodes 3:2 is not N or MIN:MAX" --nnodes 3:2 --no-secret
  expect_refused "--nnodes 0:2 is not N or MIN:MAX" --nnodes 0:2 --no-secret
  expect_refused "--nnodes 1:x is not N or MIN:MAX" --nnodes 1:x --no-secret
  expect_refused "in elastic mode each round numbers its nodes" --nnodes 1:2 --node-rank 1 --no-secret
  expect_refused "needs the same job secret on every node" --nnodes 1:2
  expect_refused "--heartbeat-timeout and --rdzv-last-call are for elastic mode" --nnodes 2 \
    --heartbeat-timeout 3 --no-secret
  # a launcher whose settings differ from the master's is refused, naming both
  shared_secret
  port=$(free_port)
  timeout -k 5 60 "$run" --nnodes 2:2 --master-port "$port" --rdzv-timeout 10 "$worker" wait \
    "$work" >"$work/a.log" 2>&1 &
  pid_a=$!
  wait_until grep -qs "serving the launchers' store" "$work/a.log"
  expect_refused "this launcher has --nproc-per-node 1 --nnodes 2:2 --max-restarts 1 but the master launcher (serving 127.0.0.1:$port) has --nproc-per-node 1 --nnodes 2:2 --max-restarts 0" \
    --nnodes 2:2 --master-port "$port" --max-restarts 1
  kill -TERM "$(launcher_of "$pid_a")"
  wait "$pid_a"
  ;;
*)
  echo "unknown case $case_name" >&2
  exit 2
  ;;
esac
echo "PASS ($case_name)"

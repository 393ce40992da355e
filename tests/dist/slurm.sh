#!/usr/bin/env bash
# ember under srun: a throwaway one-node Slurm cluster in a temporary folder (its own munged,
# slurmctld and slurmd, no cgroups, no accounting), then the same binaries that run under
# mpirun, launched by `srun --mpi=pmix`: the dist suite, the DDP check program and a short
# ember-train run. ember must see launcher "slurm" (SLURM_PROCID / SLURM_NTASKS /
# SLURM_LOCALID) and agree with MPI's ranks. The daemons are always stopped and the folder
# removed. Exits 77 (ctest: skipped) with the reason where Slurm or munge is not installed,
# the daemons cannot start or the cluster cannot run a job.
#   slurm.sh <ember_dist_tests> <ember-train> <ember_two_host_check>
set -euo pipefail
dist_tests="$1" train="$2" check="$3"
ntasks=2
deadline=$((SECONDS + 240))  # every step ends by then; ctest's limit leaves room to clean up

skip() {
  echo "SKIP: $*"
  exit 77
}
# expect FILE PATTERN: fails the test unless the step's output holds the pattern.
expect() {
  grep -q -- "$2" "$1" || { echo "FAIL: no '$2' in the output above"; exit 1; }
}

for cmd in munged slurmctld slurmd srun sinfo squeue scancel; do
  command -v "$cmd" >/dev/null ||
    skip "$cmd not found; install Debian's slurmd slurmctld slurm-client munge (scripts/setup.sh)"
done

work="$(mktemp -d "${TMPDIR:-/tmp}/ember-slurm.XXXXXX")"
chmod 755 "$work"
pids=()

# Ends every process started here: the daemons by pid, then whatever still runs in or holds a
# file in the work folder (job steps, ranks), then removes the folder.
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -n "${SLURM_CONF:-}" ]] && ((${#pids[@]} > 1)); then
    timeout 10 scancel --full --quiet --partition=ember 2>/dev/null || true
  fi
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  if [[ -f "$work/munge/munged.pid" ]]; then
    kill -TERM "$(cat "$work/munge/munged.pid")" 2>/dev/null || true
  fi
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in $(find /proc/[0-9]*/cwd /proc/[0-9]*/fd -maxdepth 1 \
    \( -lname "$work" -o -lname "$work/*" \) 2>/dev/null | cut -d/ -f3 | sort -u); do
    [[ "$pid" == "$$" ]] || kill -KILL "$pid" 2>/dev/null || true
  done
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# An enclosing Slurm allocation, mpirun or torchrun-style launch must not leak into this
# cluster's jobs: without MASTER_ADDR, srun's ranks take the MPI backend.
launch_vars='^(SLURM_|SRUN_|SALLOC_|SBATCH_|OMPI_|PMIX_|PMI_)'
launch_vars+='|^(RANK|WORLD_SIZE|LOCAL_RANK|MASTER_ADDR|MASTER_PORT)$'
while read -r name; do unset "$name"; done < <(compgen -e | grep -E "$launch_vars" || true)

mkdir -p "$work"/{munge,key,state,spool,log,tmp,run}
chmod 700 "$work/key"

# munge: its own key, socket and pid file.
head -c 1024 /dev/urandom >"$work/key/munge.key"
chmod 400 "$work/key/munge.key"
socket="$work/munge/munge.sock"
if ! munged --force --socket="$socket" --key-file="$work/key/munge.key" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/log/munged.log" \
  --seed-file="$work/munge/munged.seed" 2>"$work/log/munged.err"; then
  tail -n 3 "$work/log/munged.err" "$work/log/munged.log" 2>/dev/null || true
  skip "munged did not start (its messages above)"
fi

host="$(hostname -s)"
port=$((20000 + RANDOM % 20000))
export SLURM_CONF="$work/slurm.conf"
cat >"$SLURM_CONF" <<CONF
ClusterName=ember
SlurmctldHost=$host(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
TmpFS=$work/tmp
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=ember Nodes=ALL Default=YES MaxTime=10 State=UP OverSubscribe=FORCE
CONF

slurmctld -D -i -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N "$host" -f "$SLURM_CONF" >"$work/log/slurmd.out" 2>&1 &
pids+=($!)

daemon_logs() {
  tail -n 5 "$work"/log/slurmctld.out "$work"/log/slurmd.out "$work"/log/slurmctld.log \
    "$work"/log/slurmd.log 2>/dev/null || true
}
state=""
node_wait_until=$((SECONDS + 30 < deadline ? SECONDS + 30 : deadline))
while ((SECONDS < node_wait_until)); do
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      daemon_logs
      skip "a Slurm daemon exited at start (logs above)"
    fi
  done
  state="$(timeout 2 sinfo -h -N -n "$host" -o %T 2>/dev/null || true)"
  [[ "$state" == idle ]] && break
  sleep 0.5
done
[[ "$state" == idle ]] || { daemon_logs; skip "node $host not idle after 30 s (state '$state')"; }

mpi_types="$(timeout 10 srun --mpi=list 2>&1 || true)"
if ! grep -qw pmix <<<"$mpi_types"; then
  skip "Slurm has no PMIx plugin (srun --mpi=list: ${mpi_types//$'\n'/ })"
fi

# A job step: $ntasks tasks on this node (more tasks than cores allowed), the whole step killed
# when a task fails, run from the work folder, for at most $1 seconds and never past the
# deadline.
srun_() {
  local limit=$1 left=$((deadline - SECONDS))
  shift
  ((left < limit)) && limit=$left
  ((limit > 0)) || { echo "FAIL: out of time before: srun $*"; return 124; }
  timeout -k 5 "$limit" srun --mpi=pmix -N 1 -n "$ntasks" --overcommit --time=3 \
    --kill-on-bad-exit=1 --chdir="$work/run" "$@"
}
export TMPDIR="$work/tmp"  # Open MPI's session folders too

# step NAME SECONDS COMMAND...: one job step, its output shown and kept in $work/NAME.out.
step() {
  local name=$1 limit=$2 status=0
  shift 2
  srun_ "$limit" "$@" 2>&1 | tee "$work/$name.out" || status=$?
  ((status == 0)) || { echo "FAIL: srun $* exited with status $status"; exit 1; }
}

if ! srun_ 30 sh -c 'echo "task $SLURM_PROCID of $SLURM_NTASKS"' >"$work/hello" 2>&1; then
  cat "$work/hello"
  daemon_logs
  skip "the cluster cannot run a job step (output above)"
fi

echo "== the dist suite under srun -n $ntasks --mpi=pmix"
step suite 150 "$dist_tests" --gtest_brief=1
expect "$work/suite.out" "PASSED"

echo "== init_process_group() under srun: launcher slurm, ranks as MPI's, DDP"
step check 60 "$check"
expect "$work/check.out" "parameters agree across hosts"
# With SLURM_PROCID swapped, ember must have read Slurm's variables and refuse the mismatch.
if srun_ 60 sh -c 'SLURM_PROCID=$((SLURM_NTASKS - 1 - SLURM_PROCID)) exec "$0"' "$check" \
  >"$work/swapped.out" 2>&1; then
  cat "$work/swapped.out"
  echo "FAIL: a job whose SLURM_PROCID disagrees with MPI's rank was accepted"
  exit 1
fi
if ! grep -q "but slurm set rank" "$work/swapped.out"; then
  cat "$work/swapped.out"
  echo "FAIL: no 'slurm set rank' mismatch message (ember did not read Slurm's variables?)"
  exit 1
fi
grep -m 1 "but slurm set rank" "$work/swapped.out"

echo "== ember-train under srun -n $ntasks --mpi=pmix"
step train 90 "$train" --threads 1 --workers 0 --batch-size 32 --max-steps 5 --epochs 1 \
  --log-interval 1 --out-dir "$work/run/out"
expect "$work/train.out" " $ntasks rank(s) on cpu"
expect "$work/train.out" "^done: "

echo "ember ran under srun: the dist suite, init_process_group (launcher slurm) and ember-train" \
  "at $ntasks tasks"

#!/usr/bin/env bash
# Two hosts on this one machine: network namespaces joined by a veth pair, each with its own
# address. mpirun, started in the first, launches the second rank through a launch agent that
# enters the second namespace (`ip netns exec`); the ranks train with DDP over TCP between the
# hosts. Exits 77 (ctest: skipped) with the reason where namespaces cannot be made.
#   two_host.sh <two_host_check binary>
set -euo pipefail
program="$1"
tag="e$$"
ns1="${tag}a" ns2="${tag}b" veth1="${tag}x" veth2="${tag}y"
subnet="10.$((RANDOM % 200 + 20)).$((RANDOM % 250)).0"
addr1="${subnet%.0}.1" addr2="${subnet%.0}.2"
work="$(mktemp -d "${TMPDIR:-/tmp}/ember-two-host.XXXXXX")"

cleanup() {
  ip netns del "$ns1" 2>/dev/null || true
  ip netns del "$ns2" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

if ! command -v ip >/dev/null || ! ip netns add "$ns1" 2>"$work/err"; then
  echo "SKIP: cannot create network namespaces here ($(cat "$work/err" 2>/dev/null || echo 'no ip command')); needs root and CAP_SYS_ADMIN"
  exit 77
fi
ip netns add "$ns2"
ip link add "$veth1" type veth peer name "$veth2"
ip link set "$veth1" netns "$ns1"
ip link set "$veth2" netns "$ns2"
ip -n "$ns1" addr add "$addr1/24" dev "$veth1"
ip -n "$ns2" addr add "$addr2/24" dev "$veth2"
for ns in "$ns1" "$ns2"; do ip -n "$ns" link set lo up; done
ip -n "$ns1" link set "$veth1" up
ip -n "$ns2" link set "$veth2" up

# The launch agent: Open MPI calls it as `agent <host> <command...>` to start its daemon.
cat >"$work/agent" <<AGENT
#!/bin/sh
host="\$1"; shift
case "\$host" in
  $addr1) ns=$ns1 ;;
  $addr2) ns=$ns2 ;;
  *) echo "launch agent: unknown host \$host" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" sh -c "\$*"
AGENT
chmod +x "$work/agent"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
timeout 300 ip netns exec "$ns1" mpirun --allow-run-as-root --oversubscribe \
  -H "$addr1:1,$addr2:1" -np 2 \
  --mca plm_rsh_agent "$work/agent" \
  --mca oob_tcp_if_include "$subnet/24" \
  --mca btl tcp,self --mca btl_tcp_if_include "$subnet/24" \
  "$program" | tee "$work/out"

grep -q "rank 0 on host $addr1" "$work/out"
grep -q "rank 1 on host $addr2" "$work/out"
grep -q "parameters agree across hosts" "$work/out"
echo "two hosts ($addr1, $addr2) trained together over TCP"

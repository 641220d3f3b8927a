#!/usr/bin/env bash
# A role's start in a cell: `sealnode canary --role node` builds a cell (its user namespace, the
# two network namespaces and their sysctls) and starts one sandbox in it (the role's own user
# namespace and its id maps, then the rest of the setup), whose battery runs and exits. Beside
# it, in the same rounds: the same sandbox without a cell (`exec --role node -- /bin/true`, what
# launch.sh times) and, with SEALNODE_BENCH_BASE, both commands by another commit's build: what a
# change costs per cell and per role start. As root (rootful) and as uid 65534 (rootless); pinned
# to one CPU, ROUNDS rounds rotating the order.
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-4}; RUNS=${RUNS:-30}
out=$BENCH/results; mkdir -p "$out"
for mode in rootful rootless; do
  write_fixture "$BENCH/start-$mode" "$mode"
  c=$BENCH/start-$mode/c.toml
  from_disk "$SN" ${SEALNODE_BENCH_BASE:+"$SEALNODE_BENCH_BASE"}
  as=""; [ "$mode" = rootless ] && as="setpriv --reuid 65534 --regid 65534 --clear-groups"
  cmds=(
    "canary --role node (a cell, one role started)" "sh -c 'exec $as $SN canary --config $c --role node'"
    "exec --role node -- /bin/true (no cell)" "sh -c 'exec $as $SN exec --config $c --role node -- /bin/true'"
  )
  if [ -n "${SEALNODE_BENCH_BASE:-}" ]; then
    cmds+=(
      "base: canary --role node" "sh -c 'exec $as $SEALNODE_BENCH_BASE canary --config $c --role node'"
      "base: exec --role node -- /bin/true" "sh -c 'exec $as $SEALNODE_BENCH_BASE exec --config $c --role node -- /bin/true'"
    )
  fi
  echo "### a role's start in a cell, $mode ($ROUNDS rounds x $RUNS runs, CPU $CPU)"
  rotating_rounds "start-$mode" 5 "exec --role node -- /bin/true (no cell)"
  echo
done

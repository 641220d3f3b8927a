#!/usr/bin/env bash
# Launch overhead: `sealnode exec --role node -- /bin/true` with every layer on, against bare
# /bin/true, bwrap with all namespaces and the same allowlist compiled by libseccomp, and
# unshare -Urmnpiu --fork. As root (rootful) and as uid 65534 (rootless). Pinned to one CPU;
# ROUNDS rounds alternate the order of the commands. Every command runs through
# `sh -c 'exec ...'` (bwrap needs the filter on an fd), so all pay the same shell.
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-4}; RUNS=${RUNS:-100}
out=$BENCH/results; mkdir -p "$out"
for mode in rootful rootless; do
  write_fixture "$BENCH/$mode" "$mode"
  from_disk "$SN" "$SN_DYN" ${SEALNODE_BENCH_BASE:+"$SEALNODE_BENCH_BASE"}
  as=""; [ "$mode" = rootless ] && as="setpriv --reuid 65534 --regid 65534 --clear-groups"
  cmds=(
    "sealnode" "sh -c 'exec $as $SN exec --config $BENCH/$mode/c.toml --role node -- /bin/true'"
    "sealnode, dynamically linked" "sh -c 'exec $as $SN_DYN exec --config $BENCH/$mode/c.toml --role node -- /bin/true'"
    "bwrap + libseccomp allowlist" "sh -c 'exec $as $BWRAP --seccomp 9 /bin/true 9<$BENCH/node.libseccomp.bpf'"
    "unshare -Urmnpiu --fork" "sh -c 'exec $as unshare -Urmnpiu --fork /bin/true'"
    "bare /bin/true" "sh -c 'exec $as /bin/true'"
  )
  # SEALNODE_BENCH_BASE: a sealnode of another commit (built as $SN is), timed in the same
  # rounds: what a change costs per start, beside the anchors.
  if [ -n "${SEALNODE_BENCH_BASE:-}" ]; then
    cmds+=("sealnode, base" "sh -c 'exec $as $SEALNODE_BENCH_BASE exec --config $BENCH/$mode/c.toml --role node -- /bin/true'")
  fi
  echo "### launch, $mode ($ROUNDS rounds x $RUNS runs, CPU $CPU)"
  rotating_rounds "launch-$mode" 20 "bwrap + libseccomp allowlist"
  echo
done

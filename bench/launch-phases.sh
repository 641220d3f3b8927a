#!/usr/bin/env bash
# Where a launch's time goes, phase by phase, sealnode beside bwrap: the kernel's own
# timestamps (perf's sched and syscall tracepoints) of each process's exec, clone, exit and the
# workload's exec, over RUNS launches of each, pinned to one CPU as bench/launch.sh is. The
# phases: the launcher's own work up to the sandbox's clone (start-up, config, checks, policies,
# the clone with its namespaces), the sandbox's setup up to the workload's fork (mounts,
# pivot_root, ids), the workload's own confinement up to its exec (Landlock, seccomp, the exec),
# and the rest (the workload runs, then everything exits).
. "$(dirname "$0")/common.sh"
RUNS=${RUNS:-100}
command -v perf >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq linux-perf >/dev/null; }
out=$BENCH/results; mkdir -p "$out"
events=sched:sched_process_exec,sched:sched_process_fork,sched:sched_process_exit
for mode in rootful rootless; do
  write_fixture "$BENCH/$mode" "$mode"
  from_disk "$SN"
  as=""; [ "$mode" = rootless ] && as="setpriv --reuid 65534 --regid 65534 --clear-groups"
  files=()
  for who in sealnode bwrap; do
    if [ "$who" = sealnode ]; then one="$as $SN exec --config $BENCH/$mode/c.toml --role node -- /bin/true"
    else one="$as $BWRAP --seccomp 9 /bin/true 9<$BENCH/node.libseccomp.bpf"; fi
    # Warm-up runs, then the counted ones.
    for _ in $(seq 10); do sh -c "exec $one"; done
    perf record -q -e "$events" -o "$out/phases-$mode-$who.data" -- \
      taskset -c "$CPU" sh -c "for _ in \$(seq $RUNS); do $one; done" >/dev/null 2>&1
    perf script -i "$out/phases-$mode-$who.data" -F comm,pid,time,event,trace > "$out/phases-$mode-$who.txt" 2>/dev/null
    files+=("$who=$out/phases-$mode-$who.txt")
  done
  echo "### launch phases, $mode ($RUNS runs each, CPU $CPU, medians)"
  python3 "$(dirname "$0")/phases.py" "$SN" "${files[@]}"
  echo
done

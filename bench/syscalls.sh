#!/usr/bin/env bash
# Seccomp cost per system call: a tight loop of one class of cheap syscall (bench/syscall-loop.c)
# bare, and under the node role's allowlist compiled three ways and run by the same runner
# (bwrap --seccomp): sealnode's binary search, seccompiler's linear chain, libseccomp's binary
# tree; plus inside sealnode's real node sandbox, without and with the denial log
# (log_refused_syscalls: each refused call a round trip to sealnode). Median of ROUNDS
# alternating rounds.
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-5}; N=${N:-2000000}
write_fixture "$BENCH/rootful" rootful
write_fixture "$BENCH/logged" rootful "log_refused_syscalls = true"
run() {  # $1 = runner, $2 = class
  case $1 in
    bare) taskset -c "$CPU" "$BENCH/bin/syscall-loop" "$2" "$N" ;;
    sealnode-sandbox) taskset -c "$CPU" "$SN" exec --config "$BENCH/rootful/c.toml" --role node -- /opt/bench/syscall-loop "$2" "$N" ;;
    # The log's own lines (one a second) go to /dev/null; the loop's number is on stdout.
    sealnode-logged) taskset -c "$CPU" "$SN" exec --config "$BENCH/logged/c.toml" --role node -- /opt/bench/syscall-loop "$2" "$N" 2>/dev/null ;;
    *) taskset -c "$CPU" sh -c "exec $BWRAP --ro-bind $BENCH/bin /opt/bench --seccomp 9 /opt/bench/syscall-loop $2 $N 9<$BENCH/node.$1.bpf" ;;
  esac
}
runners=(bare sealnode seccompiler libseccomp sealnode-sandbox sealnode-logged)
echo "### seccomp cost per syscall (ns/call, median of $ROUNDS rounds, $N calls each, CPU $CPU)"
echo "| class | bare | sealnode's compiler | seccompiler | libseccomp tree | sealnode sandbox | sandbox + denial log |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for class in low high arg denied; do
  declare -A res=()
  for r in $(seq 1 "$ROUNDS"); do
    for k in $(seq 0 5); do
      i=$(( (k + r) % 6 )); x=${runners[$i]}
      res[$x]+="$(run "$x" "$class") "
    done
  done
  row="| $class"
  for x in "${runners[@]}"; do row+=" | $(echo ${res[$x]} | tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"; done
  echo "$row |"
  unset res
done
echo
echo "Classes: low = read(-1) (nr 0, allowed), high = close_range of an unused fd (nr 436, allowed), arg = ioctl TCGETS on /dev/null (argument-filtered: never cached by the kernel), denied = ioprio_get (not on the allowlist)."
echo "Program sizes (node filter): sealnode $(( $(stat -c %s "$BENCH/node.sealnode.bpf") / 8 )), seccompiler $(( $(stat -c %s "$BENCH/node.seccompiler.bpf") / 8 )), libseccomp $(( $(stat -c %s "$BENCH/node.libseccomp.bpf") / 8 )) instructions."

#!/bin/sh
# Runs INSIDE the test guest (scripts/vm run), as root, systemd as PID 1, unified cgroup v2:
# per-role cgroup limits under the shipped unit (Delegate=yes) and by hand (cell.cgroup). The
# engine is the demo's stand-in; the node is tests/vm/limits-role.py, which blows up its own
# leaf one way per run. One line per check, "ok: ..." or "FAIL: ..."; exits 1 if any failed.
#
#   tests/vm/limits.sh REPO CACHE DEB
set -u
REPO=$1 CACHE=$2 DEB=$3
SEALNODE_VM_SETUP_ONLY=1 sh "$REPO/tests/vm/unit.sh" "$REPO" "$CACHE" "$DEB" >/dev/null || { echo "FAIL: setup"; exit 1; }
# shellcheck source=tests/vm/checks.sh
. "$REPO/tests/vm/checks.sh"
# shellcheck disable=SC1091
. "$CACHE/env"
VENV=/opt/sealnode-test${SEALNODE_TEST_VENV#"$CACHE"}
PYCOPY=/opt/sealnode-test${SEALNODE_TEST_PYTHON#"$CACHE"}
install -d -m 0755 /usr/local/share/sealnode-limits
install -m 0644 "$REPO/tests/vm/limits-role.py" /usr/local/share/sealnode-limits/
CG=/sys/fs/cgroup/system.slice/sealnode.service
since() { journalctl -u sealnode --since "$T0" --no-pager; }
# A config: the stand-in engine, the limits role in MODE, and the limits given (TOML lines).
config() {  # MODE NODE_LIMITS [CELL_EXTRA] [NODE_EXTRA]; $ENGINE_LIMITS replaces the engine's
  cat > /etc/sealnode/sealnode.toml <<TOML
schema = 1
[cell]
hostname = "sealnode-limits"
state_dir = "/var/lib/sealnode"
runtime_dir = "/run/sealnode"
rootful = { engine = "sealnode-engine", node = "sealnode-node" }
stop_timeout_s = 5
preflight_timeout_s = 180
${3:-}
[engine]
command = ["$VENV/bin/python", "-I", "-u", "/opt/standin/standin-engine.py", "--port", "11434"]
port = 11434
seccomp = "/usr/share/sealnode/seccomp/engine.json"
landlock = "/usr/share/sealnode/landlock-rules/engine.toml"
models = "/var/lib/sealnode/models"
scratch = "/var/lib/sealnode/engine"
ro_binds = [{ src = "$PYCOPY", dst = "$SEALNODE_TEST_PYTHON_PREFIX" }, { src = "$VENV" }, { src = "/usr/local/share/sealnode-standin", dst = "/opt/standin" }]
ready = { kind = "http", path = "/", timeout_s = 60 }
limits = { ${ENGINE_LIMITS:-memory_max_mb = 256, pids_max = 64} }
[node]
command = ["$VENV/bin/python", "-I", "-u", "/opt/limits/limits-role.py", "$1"]
seccomp = "/usr/share/sealnode/seccomp/node.json"
landlock = "/usr/share/sealnode/landlock-rules/node.toml"
scratch = "/var/lib/sealnode/node"
ro_binds = [{ src = "$PYCOPY", dst = "$SEALNODE_TEST_PYTHON_PREFIX" }, { src = "$VENV" }, { src = "/usr/local/share/sealnode-limits", dst = "/opt/limits" }]
restart = "on-failure"
limits = { $2 }
${4:-}
TOML
}
status() { /usr/bin/sealnode ctl status --json > /tmp/status.json && "$VENV/bin/python" -c "$1" /tmp/status.json; }
start() { T0=$(date '+%Y-%m-%d %H:%M:%S'); timeout 300 systemctl start sealnode.service; }
# A start that must succeed; on failure, the unit's journal since it says why.
started() {
  if start; then return 0; fi
  bad "start ($1)"
  since | tail -30
}
stop() { timeout 120 systemctl stop sealnode.service; systemctl reset-failed sealnode.service 2>/dev/null; }
wait_log() {  # SECONDS PATTERN
  for _ in $(seq 1 "$1"); do since | grep -q "$2" && return 0; sleep 1; done
  return 1
}
echo "guest: $(uname -r), $(stat -fc %T /sys/fs/cgroup)"

# 1. Memory: the node's hog is OOM-killed at memory_max_mb, the engine keeps answering, the
#    node restarts per its policy; ctl status shows the kill.
config oom "memory_max_mb = 96"
if start; then ok "start with limits under the unit"; else bad "start with limits under the unit"; since | tail -20; exit 1; fi
check "the leaves are the unit's: supervisor, engine, node" \
  sh -c "[ -d $CG/supervisor ] && [ -d $CG/engine ] && [ -d $CG/node ] && grep -qx \"\$(systemctl show -p MainPID --value sealnode)\" $CG/supervisor/cgroup.procs"
check "node.limits.memory_max_mb written (memory.max = 96 MiB), oom.group, no swap" \
  sh -c "[ \$(cat $CG/node/memory.max) = $((96 * 1024 * 1024)) ] && [ \$(cat $CG/node/memory.oom.group) = 1 ] && [ \$(cat $CG/node/memory.swap.max) = 0 ]"
check "engine's own limits in its leaf (256 MiB, 64 pids)" \
  sh -c "[ \$(cat $CG/engine/memory.max) = $((256 * 1024 * 1024)) ] && [ \$(cat $CG/engine/pids.max) = 64 ]"
rolepid() { /usr/bin/sealnode ctl status --json | "$VENV/bin/python" -c "import json,sys; print([r['pid'] for r in json.load(sys.stdin)['roles'] if r['role'] == sys.argv[1]][0])" "$1"; }
epid=$(rolepid engine)
check "the engine's sandbox ($epid) runs in the engine leaf" grep -qx "$epid" $CG/engine/cgroup.procs
check "the node's hog is logged as an OOM kill with its limit" wait_log 120 "role OOM-killed.*memory_max_mb=96"
check "the node restarted and the engine answered it" wait_log 120 "engine answered 200"
check "ctl status: node oom_kill >= 1, one restart; the engine never restarted" status '
import json, sys
s = json.load(open(sys.argv[1]))
r = {x["role"]: x for x in s["roles"]}
n, e = r["node"], r["engine"]
assert n["resources"]["memory_events"]["oom_kill"] >= 1, n
assert n["restarts"] == 1 and e["restarts"] == 0, (n["restarts"], e["restarts"])
assert n["resources"]["limits"]["memory.max"] == str(96 << 20), n
assert e["resources"]["memory_current"] > 0 and e["resources"]["pids_current"] >= 1, e
'
check "the receipt records each role's limits" sh -c "grep -q '\"memory.max\": \"$((96 * 1024 * 1024))\"' /var/lib/sealnode/receipt.json"
# The same facts as metrics, parsed by the reference parser (prometheus_client).
check "ctl metrics: the node's OOM kill and both roles' cgroup memory, as parsed metrics" sh -c '
/usr/bin/sealnode ctl metrics | "$0/bin/python" -c "
import sys
from prometheus_client.parser import text_string_to_metric_families
m = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(sys.stdin.read()) for s in f.samples}
assert m[(\"sealnode_role_oom_kills_total\", ((\"role\", \"node\"),))] >= 1, m
assert m[(\"sealnode_role_memory_bytes\", ((\"role\", \"engine\"),))] > 0, m
assert m[(\"sealnode_role_pids\", ((\"role\", \"engine\"),))] >= 1, m
assert m[(\"sealnode_role_restarts_total\", ((\"role\", \"node\"),))] == 1, m
"' "$VENV"
stop
check "the role leaves are gone after the stop" sh -c "[ ! -e $CG/engine ] && [ ! -e $CG/node ]"

# 2. A fork bomb (threads) in the node stops at pids_max; the engine and the supervisor go on.
config forkbomb "pids_max = 32"
started forkbomb
check "the fork bomb stops at pids_max" wait_log 120 "pids refused after"
npid=$(rolepid node) epid=$(rolepid engine)
check "the node's sandbox ($npid) runs in the node leaf, no role in the supervisor leaf" \
  sh -c "grep -qx '$npid' $CG/node/cgroup.procs && ! grep -qx '$npid' $CG/supervisor/cgroup.procs && ! grep -qx '$epid' $CG/supervisor/cgroup.procs"
check "the engine still answers the node holding all its pids" wait_log 60 "engine answered 200"
check "ctl status: the node's pids at the limit, pids.events max > 0" status '
import json, sys
s = json.load(open(sys.argv[1]))
n = {x["role"]: x for x in s["roles"]}["node"]["resources"]
assert n["pids_current"] >= 30 and n["pids_events"]["max"] > 0, n
'
stop

# 3. A CPU hog (two busy processes) is throttled to cpu_max = 0.5: measured from cpu.stat
#    over 8 s. At most 0.5 CPU plus 10% (one 100 ms period of slack at each end of the
#    window); the lower end is not checked: under emulation the host may not give the guest
#    its half CPU.
# The same run caps the node's I/O on the guest's root disk (virtio): io.max written for real.
mm=$(stat -Lc '%t %T' /dev/vda); vda="$((0x${mm% *})):$((0x${mm#* }))"
config cpu "cpu_max = 0.5, io_max = [{ device = \"/dev/vda\", rbps = 10485760, wiops = 100 }]"
started cpu
check "node.limits.io_max written: io.max of the node's leaf is '$vda rbps=10485760 wbps=max riops=max wiops=100'" \
  grep -qx "$vda rbps=10485760 wbps=max riops=max wiops=100" $CG/node/io.max
check "the engine's leaf has no io.max of its own" sh -c "[ -z \"\$(cat $CG/engine/io.max 2>/dev/null)\" ]"
sleep 3
u0=$(awk '$1 == "usage_usec" {print $2}' $CG/node/cpu.stat); t0=$(date +%s%N)
sleep 8
u1=$(awk '$1 == "usage_usec" {print $2}' $CG/node/cpu.stat); t1=$(date +%s%N)
share=$(awk -v du=$((u1 - u0)) -v dt=$(((t1 - t0) / 1000)) 'BEGIN { printf "%.3f", du / dt }')
echo "info: the CPU hog used $share CPU (cpu_max 0.5)"
check "the CPU hog is throttled to cpu_max (used $share CPU)" awk -v s="$share" 'BEGIN { exit !(s <= 0.55) }'
check "cpu.stat counts throttled periods" sh -c "[ \$(awk '\$1 == \"nr_throttled\" {print \$2}' $CG/node/cpu.stat) -gt 0 ]"
# 3a. A reload that changes only limits writes them into the running leaves: no role restarts,
#     a limit taken out (io_max) goes back to the kernel's default, a new receipt says so.
npid=$(rolepid node) epid=$(rolepid engine)
gen() { "$VENV/bin/python" -c "import json; print(json.load(open('/var/lib/sealnode/receipt.json'))['generation'])"; }
g0=$(gen)
ENGINE_LIMITS="memory_max_mb = 192, pids_max = 64" config cpu "cpu_max = 0.25"
T0=$(date '+%Y-%m-%d %H:%M:%S')
systemctl reload sealnode.service
check "a limits-only reload is applied in place" wait_log 60 "reload applied in place"
check "reload, live: the node's cpu.max is 0.25 CPU ('$(cat $CG/node/cpu.max)')" grep -qx "25000 100000" $CG/node/cpu.max
check "reload, live: the engine's memory.max is 192 MiB" sh -c "[ \$(cat $CG/engine/memory.max) = $((192 * 1024 * 1024)) ]"
check "reload, live: io_max taken out, no io.max line for $vda in the node's leaf" sh -c "! grep -q '^$vda ' $CG/node/io.max"
e1=$(rolepid engine) n1=$(rolepid node) g1=$(gen)
check "reload, live: no role restarted (engine $epid, now $e1; node $npid, now $n1)" test "$e1 $n1" = "$epid $npid"
check "reload, live: a new receipt generation ($g0, now $g1) records the new limits" sh -c \
  "[ $g1 -gt $g0 ] && grep -q '\"cpu.max\": \"25000 100000\"' /var/lib/sealnode/receipt.json && ! grep -q '\"io.max\"' /var/lib/sealnode/receipt.json"
check "reload, live: ctl status shows the reload applied and the new limits" status '
import json, sys
s = json.load(open(sys.argv[1]))
assert s["reload"]["ok"], s["reload"]
r = {x["role"]: x for x in s["roles"]}
assert r["node"]["resources"]["limits"]["cpu.max"] == "25000 100000", r["node"]["resources"]
assert r["engine"]["resources"]["limits"]["memory.max"] == str(192 << 20), r["engine"]["resources"]
assert r["node"]["restarts"] == 0 and r["engine"]["restarts"] == 0
'
stop

# 3a'. A lower memory_max_mb on reload: the kernel reclaims the node's page cache inside the
#      write to memory.max, which sealnode makes from a child once the limit reads back in
#      force; the reload is applied and logged while the kernel still reclaims.
config cache "memory_max_mb = 1024"
started cache
check "the node has its page cache" wait_log 240 "cached 400 MiB"
sync  # written back (the node's policy has no fsync): clean cache, reclaimed without waiting on the disk
cur=$(cat $CG/node/memory.current)
echo "info: the node's memory.current $cur before the reload"
npid=$(rolepid node)
config cache "memory_max_mb = 128"
T0=$(date '+%Y-%m-%d %H:%M:%S')
systemctl reload sealnode.service
check "reload, lower memory.max: the reclaim is done" wait_log 120 "a lower memory limit's reclaim is done"
since | grep -E "limit in force|reload applied in place|reclaim is done" | sed 's/^/info: /'
line_of() { since | grep -n "$1" | head -1 | cut -d: -f1; }
l_force=$(line_of "limit in force; the kernel reclaims") l_applied=$(line_of "reload applied in place") l_done=$(line_of "reclaim is done")
check "reload, lower memory.max: in force and applied before the kernel was done (lines $l_force < $l_applied < $l_done)" \
  sh -c "[ -n '$l_force' ] && [ -n '$l_applied' ] && [ '$l_force' -lt '$l_applied' ] && [ '$l_applied' -lt '$l_done' ]"
check "reload, lower memory.max: the node's memory.current is under 128 MiB now" \
  sh -c "[ \$(cat $CG/node/memory.current) -le $((128 * 1024 * 1024)) ]"
n1=$(rolepid node)
check "reload, lower memory.max: the node was reclaimed, not killed or restarted (pid $npid, now $n1)" \
  sh -c "[ '$n1' = '$npid' ] && ! grep -q 'oom_kill [1-9]' $CG/node/memory.events"
check "reload, lower memory.max: no writer child left" sh -c "! pgrep -x sealnode-limit"
stop

# 3b. A capped scratch: the node fills it and gets ENOSPC at scratch_max_mb; the host's disk
#     is untouched (the tmpfs is the cell's, in memory, charged to the node's leaf).
config fill "memory_max_mb = 96" "" "scratch_max_mb = 8"
free0=$(df --output=avail -k /var/lib/sealnode | tail -1)
started fill
# 7 or 8 MiB written: what an 8 MiB tmpfs takes (0 written would be a scratch that was never the cap).
check "filling scratch stops at scratch_max_mb with ENOSPC" wait_log 120 "scratch full after [78] MiB.*No space left"
free1=$(df --output=avail -k /var/lib/sealnode | tail -1)
check "the host filesystem's free space is unchanged (before $free0 KiB, after $free1 KiB)" \
  test $((free0 - free1)) -lt 1024
check "the host's scratch dir got nothing" sh -c "[ -z \"\$(ls -A /var/lib/sealnode/node)\" ]"
shmem=$(awk '$1 == "shmem" {print $2}' $CG/node/memory.stat)
check "the tmpfs is charged to the node's leaf (memory.stat shmem $shmem >= 7 MiB)" test "$shmem" -ge $((7 * 1024 * 1024))
stop

# 4. By hand as root: cell.cgroup names the cell's cgroup; sealnode moves itself into its
#    supervisor leaf, makes the role leaves, and removes them when it stops.
config forkbomb "pids_max = 40" 'cgroup = "sealnode-byhand"'
H=/sys/fs/cgroup/sealnode-byhand
/usr/bin/sealnode run --config /etc/sealnode/sealnode.toml > /tmp/byhand.log 2>&1 &
pid=$!
for _ in $(seq 1 120); do grep -q "pids refused after" /tmp/byhand.log && break; sleep 1; done
check "by hand: sealnode in $H/supervisor" grep -qx "$pid" $H/supervisor/cgroup.procs
check "by hand: node.limits.pids_max in force (pids.max 40, the bomb stopped)" \
  sh -c "[ \$(cat $H/node/pids.max) = 40 ] && grep -q 'pids refused after' /tmp/byhand.log"
kill -TERM "$pid"; wait_exit "$pid" 60
check "by hand: a clean stop (exit $code)" test "$code" = 0
check "by hand: the role leaves are removed" sh -c "[ ! -e $H/engine ] && [ ! -e $H/node ]"
# A crashed run's leaves (kill -9) are made afresh: its limits and OOM counts are gone.
config oom "memory_max_mb = 96" 'cgroup = "sealnode-byhand"'
/usr/bin/sealnode run --config /etc/sealnode/sealnode.toml > /tmp/byhand.log 2>&1 &
pid=$!
# The node blows its memory up: the OOM kill is reported (the run the next check compares with).
for _ in $(seq 1 120); do grep -q "OOM-killed" /tmp/byhand.log && break; sleep 1; done
check "by hand: the first run's node was OOM-killed and said so" grep -q "role OOM-killed" /tmp/byhand.log
kill -9 "$pid"; wait_exit "$pid" 30
for _ in $(seq 1 30); do [ -z "$(cat $H/node/cgroup.procs $H/engine/cgroup.procs 2>/dev/null)" ] && break; sleep 1; done
config forkbomb "pids_max = 40" 'cgroup = "sealnode-byhand"'
/usr/bin/sealnode run --config /etc/sealnode/sealnode.toml > /tmp/byhand.log 2>&1 &
pid=$!
for _ in $(seq 1 120); do grep -q "pids refused after" /tmp/byhand.log && break; sleep 1; done
check "by hand after a kill -9: the old leaf's memory.max is gone, no false OOM report" \
  sh -c "[ \$(cat $H/node/memory.max) = max ] && ! grep -q 'OOM-killed' /tmp/byhand.log"
# A leaf in use (someone's child cgroup in it, so it outlives the stop) refuses the next run.
mkdir -p $H/node/intruder
kill -TERM "$pid"; wait_exit "$pid" 60
timeout 120 /usr/bin/sealnode run --config /etc/sealnode/sealnode.toml > /tmp/second.log 2>&1; code=$?
check "by hand: a leaf still in use refuses the next run, naming it (exit $code)" \
  sh -c "[ $code != 0 ] && grep -q 'node is in use' /tmp/second.log"
rmdir $H/node/intruder $H/node 2>/dev/null
# cell.cgroup under a dir another user owns: refused (they could move the roles out).
mkdir -p /sys/fs/cgroup/sealnode-foreign && chown nobody /sys/fs/cgroup/sealnode-foreign
config forkbomb "pids_max = 40" 'cgroup = "sealnode-foreign/cell"'
timeout 120 /usr/bin/sealnode run --config /etc/sealnode/sealnode.toml > /tmp/foreign.log 2>&1; code=$?
check "by hand: cell.cgroup under another user's cgroup is refused (exit $code)" \
  sh -c "[ $code = 125 ] && grep -q 'cell.cgroup' /tmp/foreign.log && grep -q 'another user could move' /tmp/foreign.log"
rmdir /sys/fs/cgroup/sealnode-foreign/cell 2>/dev/null; rmdir /sys/fs/cgroup/sealnode-foreign 2>/dev/null

# 5. Rootless: the rootless unit's cgroup is delegated to user sealnode; the same leaves.
config forkbomb "pids_max = 24"
sed -e '/^rootful = /d' -e 's#/var/lib/sealnode/models#@MODELS@#' -e 's#/var/lib/sealnode#/var/lib/sealnode-rootless#g' \
    -e 's#@MODELS@#/var/lib/sealnode/models#' -e 's#/run/sealnode"#/run/sealnode-rootless"#' \
  /etc/sealnode/sealnode.toml > /etc/sealnode/rootless.toml
RG=/sys/fs/cgroup/system.slice/sealnode-rootless.service
T0=$(date '+%Y-%m-%d %H:%M:%S')
if timeout 300 systemctl start sealnode-rootless.service; then ok "rootless: start with limits"; else bad "rootless: start with limits"; journalctl -u sealnode-rootless --no-pager | tail -15; fi
for _ in $(seq 1 120); do journalctl -u sealnode-rootless --since "$T0" --no-pager | grep -q "pids refused after" && break; sleep 1; done
check "rootless: the node's leaf has pids.max 24 and the bomb stopped there" \
  sh -c "[ \$(cat $RG/node/pids.max) = 24 ] && journalctl -u sealnode-rootless --since '$T0' --no-pager | grep -q 'pids refused after'"
check "rootless: the leaves belong to sealnode" test "$(stat -c %U $RG/node/cgroup.procs)" = sealnode
timeout 120 systemctl stop sealnode-rootless.service
exit $failed

#!/bin/sh
# Runs INSIDE the test guest (scripts/vm run), as root, with systemd as PID 1 and cgroup v2:
# installs the sealnode package and runs its unit for real: the demo's stand-in engine, the
# real frutebox-node, a stand-in gateway inside the guest reached through declared egress.
# One line per check, "ok: ..." or "FAIL: ..."; exits 1 if any check failed.
#
#   tests/vm/unit.sh REPO CACHE DEB
set -u
REPO=$1 CACHE=$2 DEB=$3
# shellcheck source=tests/vm/checks.sh
. "$REPO/tests/vm/checks.sh"
# shellcheck disable=SC1091
. "$CACHE/env"
# The shared Python and venv live in the host's test cache under /var/tmp, which the unit's
# PrivateTmp= hides: give them a place an operator's install would have.
mkdir -p /opt/sealnode-test && mount --bind "$CACHE" /opt/sealnode-test
SEALNODE_TEST_VENV=/opt/sealnode-test${SEALNODE_TEST_VENV#"$CACHE"}
SEALNODE_TEST_PYTHON=/opt/sealnode-test${SEALNODE_TEST_PYTHON#"$CACHE"}
# The venv names its interpreter at the prefix it was built at: make that path the shared copy.
mkdir -p "$(dirname "$SEALNODE_TEST_PYTHON_PREFIX")"
ln -sfn "$SEALNODE_TEST_PYTHON" "$SEALNODE_TEST_PYTHON_PREFIX"
PY=$SEALNODE_TEST_VENV/bin/python
echo "guest: $(uname -r), $(cat /proc/1/comm) as PID 1, $(stat -fc %T /sys/fs/cgroup)"

must "dpkg -i the package" sh -c "dpkg -i '$DEB' >/dev/null"
check "the unit is installed but not enabled" test "$(systemctl is-enabled sealnode.service)" = disabled

# The operator's part: the engine (stand-in), the node (real frutebox-node), the gateway's egress.
install -d -m 0755 /usr/local/share/sealnode-standin
install -m 0644 "$REPO/examples/demo/standin-engine.py" "$REPO/examples/demo/standin-gateway.py" /usr/local/share/sealnode-standin/
echo "the stand-in engine loads no weights" > /var/lib/sealnode/models/README
install -o sealnode-node -g sealnode-node -m 0400 /dev/null /etc/sealnode/credential
echo "guest-credential" > /etc/sealnode/credential
GW=18765
# The demo's config (examples/demo/sealnode.toml.in), with the package's paths for each dir.
sed -e "s#@DEMO@/state#/var/lib/sealnode#" -e "s#@DEMO@/run#/run/sealnode#" \
    -e "s#@DEMO@/models#/var/lib/sealnode/models#" -e "s#@DEMO@/engine#/var/lib/sealnode/engine#" \
    -e "s#@DEMO@/node#/var/lib/sealnode/node#" -e "s#@DEMO@/credential#/etc/sealnode/credential#" \
    -e "s#@DEMO@/standin#/usr/local/share/sealnode-standin#" -e "s#@POLICY@#/usr/share/sealnode#g" \
    -e "s#@VENV@#$SEALNODE_TEST_VENV#g" -e "s#@PYCOPY@#$SEALNODE_TEST_PYTHON#g" \
    -e "s#@PYPREFIX@#$SEALNODE_TEST_PYTHON_PREFIX#g" -e "s#@GWPORT@#$GW#g" \
    "$REPO/examples/demo/sealnode.toml.in" > /etc/sealnode/sealnode.toml
# Under software emulation a canary battery takes tens of seconds, more than the default 30 s
# when the host is busy: a timed-out preflight would exit 6 and systemd would restart the unit.
sed -i '/^\[cell\]$/a preflight_timeout_s = 180' /etc/sealnode/sealnode.toml
chmod 0644 /etc/sealnode/sealnode.toml
# Stop once the package and its config are in place (tests/vm/old-kernel.sh, or by hand).
[ "${SEALNODE_VM_SETUP_ONLY:-}" = 1 ] && exit 0
must "doctor --config accepts it" sh -c "/usr/bin/sealnode doctor --config /etc/sealnode/sealnode.toml >/dev/null"

# The gateway stand-in, as a transient unit: it exits 0 once a job round trip completed.
systemd-run --unit=sealnode-vm-gateway --service-type=exec -p StandardOutput=journal \
  "$PY" -u /usr/local/share/sealnode-standin/standin-gateway.py --port $GW --model standin --timeout 600 >/dev/null 2>&1
sleep 1

t0=$(date +%s)
must "systemctl start returns (after READY)" timeout 300 systemctl start sealnode.service
t1=$(date +%s)
echo "info: systemctl start took $((t1 - t0)) s"
state=$(systemctl show -p ActiveState --value sealnode.service)
check "active once start returned (got $state)" test "$state" = active
status=$(systemctl show -p StatusText --value sealnode.service)
echo "info: STATUS=$status"
check "STATUS= text visible in systemctl show" test -n "$status"
# READY=1 means the engine answered its readiness check and the node was started.
check "the node runs when start returned" sh -c "ps -eo args | grep -q '[f]rutebox.provider'"
# A job round trip through declared egress: the gateway stand-in exits 0 once both results came.
for _ in $(seq 1 240); do
  [ "$(systemctl show -p ActiveState --value sealnode-vm-gateway.service)" = active ] || break
  sleep 1
done
gw=$(systemctl show -p Result --value sealnode-vm-gateway.service)
check "a job round trip through the gateway stand-in (gateway result: $gw)" test "$gw" = success
journalctl -u sealnode-vm-gateway --no-pager | grep "gateway:" | tail -5 | sed 's/^/info: /'
check "ctl status answers" sh -c "/usr/bin/sealnode ctl status --json > /tmp/status.json"
gen() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["generation"])' /var/lib/sealnode/receipt.json 2>/dev/null || echo 0; }
g1=$(gen)
check "the first start wrote receipt generation 1 (got $g1)" test "$g1" = 1

# systemctl reload: a new generation through the gate, the unit active again.
must "systemctl reload returns" timeout 300 systemctl reload sealnode.service
for _ in $(seq 1 120); do [ "$(gen)" -gt "$g1" ] 2>/dev/null && break; sleep 1; done
g2=$(gen)
check "reload wrote a new receipt generation ($g1 -> $g2)" test "$g2" -gt "$g1"
# RELOADING=1 holds the unit in "reloading" until READY=1: both roles run again.
for _ in $(seq 1 120); do [ "$(systemctl show -p ActiveState --value sealnode.service)" = active ] && break; sleep 1; done
check "active again after the reload (READY=1 once both roles run)" test "$(systemctl show -p ActiveState --value sealnode.service)" = active

# The journal has sealnode's own lines.
check "the journal has sealnode's lines" sh -c "journalctl -u sealnode --no-pager | grep -q 'preflight passed'"
# Native journal entries: sealnode's own under SYSLOG_IDENTIFIER=sealnode with priorities and
# fields, each role's output under its own identifier, tagged with ROLE, PID, GENERATION, STREAM.
journal_has() {  # PYTHON-CONDITION over each entry e (a dict): true if any entry matches
  journalctl -u sealnode -o json --no-pager | "$PY" -c "
import json, sys
ok = any(($1) for e in map(json.loads, sys.stdin))
sys.exit(0 if ok else 1)"
}
check "journal: 'role started' at priority 5 with ROLE, PID and GENERATION fields" \
  journal_has "e.get('SYSLOG_IDENTIFIER') == 'sealnode' and e.get('MESSAGE', '').startswith('role started ') and e.get('PRIORITY') == '5' and e.get('ROLE') == 'engine' and e.get('PID', '').isdigit() and e.get('GENERATION') == '1'"
check "journal: the engine's own output under sealnode-engine, with ROLE=engine and STREAM" \
  journal_has "e.get('SYSLOG_IDENTIFIER') == 'sealnode-engine' and e.get('ROLE') == 'engine' and e.get('STREAM') in ('stdout', 'stderr')"
check "journal: the node's own output under sealnode-node (frutebox's log lines)" \
  journal_has "e.get('SYSLOG_IDENTIFIER') == 'sealnode-node' and e.get('ROLE') == 'node' and e.get('GENERATION', '').isdigit()"
# Parsed, not grepped (a member order or another role would slip past a pattern): no entry
# under sealnode's own identifier carries a role's output (a STREAM field), for either role.
check "journal: no role line under sealnode's own identifier" \
  not journal_has "e.get('SYSLOG_IDENTIFIER') == 'sealnode' and 'STREAM' in e"
check "journal: the check above sees role lines where they are (it can fail)" \
  journal_has "e.get('SYSLOG_IDENTIFIER') in ('sealnode-engine', 'sealnode-node') and 'STREAM' in e"
check "journal: journalctl -t sealnode-engine shows the engine alone" \
  sh -c "journalctl -u sealnode -t sealnode-engine --no-pager -o cat | grep -q . && ! journalctl -u sealnode -t sealnode-engine --no-pager -o cat | grep -q 'preflight passed'"

# Stop: within TimeoutStopSec, nothing left in the unit's cgroup, scratch wiped.
cg=/sys/fs/cgroup/system.slice/sealnode.service
touch /var/lib/sealnode/node/x 2>/dev/null || true
t0=$(date +%s)
check "systemctl stop returns" timeout 120 systemctl stop sealnode.service
t1=$(date +%s)
check "stopped within TimeoutStopSec (took $((t1 - t0)) s)" test $((t1 - t0)) -le 45
result=$(systemctl show -p Result --value sealnode.service)
check "a clean stop (Result=$result)" test "$result" = success
# cgroupfs files report size 0 whatever they hold: read them, the unit's and every leaf's.
check "no process left in the unit's cgroup" \
  sh -c "[ ! -e $cg ] || [ -z \"\$(find $cg -name cgroup.procs -exec cat {} + 2>/dev/null)\" ]"
check "no role process left anywhere" sh -c "! ps -eo args | grep -q '[f]rutebox.provider\|[s]tandin-engine'"
check "scratch wiped" sh -c "[ -z \"\$(ls -A /var/lib/sealnode/node)\" ] && [ -z \"\$(ls -A /var/lib/sealnode/engine)\" ]"

# The gateway stand-in for the scenarios below, on HOST, and its end.
gateway() {  # HOST: a fresh gateway stand-in, exits 0 after a job round trip
  systemctl stop sealnode-vm-gateway 2>/dev/null; systemctl reset-failed sealnode-vm-gateway 2>/dev/null
  systemd-run --unit=sealnode-vm-gateway --service-type=exec -p StandardOutput=journal \
    "$PY" -u /usr/local/share/sealnode-standin/standin-gateway.py --host "$1" --port $GW --model standin --timeout 600 >/dev/null 2>&1
  sleep 1
}
gateway_done() {  # wait up to $1 s for the gateway to finish; its Result is "success" only then
  for _ in $(seq 1 "$1"); do
    [ "$(systemctl show -p ActiveState --value sealnode-vm-gateway.service)" = active ] || break
    sleep 1
  done
  [ "$(systemctl show -p ActiveState --value sealnode-vm-gateway.service)" != active ] &&
    [ "$(systemctl show -p Result --value sealnode-vm-gateway.service)" = success ]
}

# Three drop-ins an operator may add, checked in one start (each start costs a pass through the
# gate, minutes under software emulation) and one watchdog restart:
# - the denial log: opt-in, with the one syscall it needs (pidfd_getfd, in @debug, which the
#   unit denies) given back by a drop-in. The node's glibc tries clone3 for each thread
#   (refused: ENOSYS, it falls back to clone): that refusal is logged;
# - IPAddressDeny=any: the host side of egress reaches loopback only. A gateway elsewhere (here
#   on a dummy interface, still inside the guest) is unreachable until a drop-in allows it;
# - the watchdog: a short WatchdogSec, the supervisor stopped with SIGSTOP: systemd restarts it,
#   here with the drop-in that allows the gateway, and the job then goes through.
cp /etc/sealnode/sealnode.toml /etc/sealnode/sealnode.toml.orig
sed -i '/^\[node\]/a log_refused_syscalls = true' /etc/sealnode/sealnode.toml
since=$(date '+%Y-%m-%d %H:%M:%S')
check "the denial log without the drop-in: the start is refused" sh -c "! timeout 300 systemctl start sealnode.service"
check "... and sealnode says which drop-in allows it" \
  sh -c "journalctl -u sealnode --since '$since' --no-pager | grep -q 'SystemCallFilter=pidfd_getfd'"
systemctl reset-failed sealnode.service
ip link add sealnode-gw type dummy && ip addr add 10.99.0.1/24 dev sealnode-gw && ip link set sealnode-gw up
sed -i "s#connect = \"127.0.0.1:$GW\"#connect = \"10.99.0.1:$GW\"#" /etc/sealnode/sealnode.toml
gateway 10.99.0.1
mkdir -p /etc/systemd/system/sealnode.service.d
printf '[Service]\nSystemCallFilter=pidfd_getfd\n' > /etc/systemd/system/sealnode.service.d/denylog.conf
printf '[Service]\nWatchdogSec=5s\nRestartSec=1s\n' > /etc/systemd/system/sealnode.service.d/watchdog.conf
systemctl daemon-reload
since=$(date '+%Y-%m-%d %H:%M:%S')
must "start with the denial log, a 5 s watchdog, and the gateway outside IPAddressAllow=" timeout 300 systemctl start sealnode.service
for _ in $(seq 1 90); do
  journalctl -u sealnode --since "$since" --no-pager | grep -q "egress connect timed out" &&
    journalctl -u sealnode --since "$since" --no-pager | grep -q "refused syscall" && break
  sleep 1
done
check "journal: a refused syscall of the node at priority 4 with ROLE, SYSCALL and ERRNO" \
  journal_has "e.get('MESSAGE', '').startswith('refused syscall ') and e.get('SYSLOG_IDENTIFIER') == 'sealnode' and e.get('PRIORITY') == '4' and e.get('ROLE') == 'node' and e.get('SYSCALL') == 'clone3' and e.get('ERRNO', '').startswith('ENOSYS')"
check "the node still runs (the refusal answered as before: ENOSYS, glibc falls back)" \
  sh -c "ps -eo args | grep -q '[f]rutebox.provider'"
check "the unit's IPAddressDeny= drops the connect to a gateway it does not allow, and sealnode says so" \
  sh -c "journalctl -u sealnode --since '$since' --no-pager | grep 'egress connect timed out' | grep -q IPAddressAllow="
check "no job round trip while the gateway is not allowed" test "$(systemctl show -p ActiveState --value sealnode-vm-gateway.service)" = active
printf '[Service]\nIPAddressAllow=10.99.0.1\n' > /etc/systemd/system/sealnode.service.d/gateway.conf
systemctl daemon-reload
n0=$(systemctl show -p NRestarts --value sealnode.service)
pid=$(systemctl show -p MainPID --value sealnode.service)
kill -STOP "$pid"
for _ in $(seq 1 120); do
  n=$(systemctl show -p NRestarts --value sealnode.service)
  [ "$n" -gt "$n0" ] && break
  sleep 1
done
check "the watchdog restarted a stopped supervisor (restarts $n0 -> $n)" test "$n" -gt "$n0"
for _ in $(seq 1 300); do [ "$(systemctl show -p ActiveState --value sealnode.service)" = active ] && break; sleep 1; done
check "active again after the watchdog restart" test "$(systemctl show -p ActiveState --value sealnode.service)" = active
journalctl -u sealnode --no-pager | grep -i "watchdog" | tail -2 | sed 's/^/info: /'
check "a job round trip once the drop-in allows the gateway" gateway_done 240
timeout 120 systemctl stop sealnode.service
rm -rf /etc/systemd/system/sealnode.service.d; systemctl daemon-reload
mv /etc/sealnode/sealnode.toml.orig /etc/sealnode/sealnode.toml

# The exposure score, from the guest's own systemd.
score=$(systemd-analyze security sealnode.service 2>/dev/null | sed -n 's/.*Overall exposure level for sealnode.service: \([0-9.]*\).*/\1/p')
echo "info: systemd-analyze security sealnode.service: $score"
check "an exposure score" test -n "$score"

# The rootless unit: sealnode itself as user sealnode, no capability; both roles as that user.
# (The model dir stays the package's /var/lib/sealnode/models, readable by every user.)
sed -e '/^rootful = /d' -e 's#/var/lib/sealnode/models#@MODELS@#' -e 's#/var/lib/sealnode#/var/lib/sealnode-rootless#g' \
    -e 's#@MODELS@#/var/lib/sealnode/models#' -e 's#/run/sealnode"#/run/sealnode-rootless"#' \
    /etc/sealnode/sealnode.toml > /etc/sealnode/rootless.toml
chmod 0644 /etc/sealnode/rootless.toml
# The node role now runs as sealnode: so must its credential belong to it.
chown sealnode:sealnode /etc/sealnode/credential
gateway 127.0.0.1
must "systemctl start sealnode-rootless returns (after READY)" timeout 300 systemctl start sealnode-rootless.service
check "rootless: a job round trip through the gateway stand-in" gateway_done 240
check "rootless: sealnode runs as user sealnode" \
  test "$(ps -o user= -p "$(systemctl show -p MainPID --value sealnode-rootless.service)")" = sealnode
check "rootless: both roles run as user sealnode" \
  sh -c "[ \"\$(ps -eo user=,args= | grep '[f]rutebox.provider\|[s]tandin-engine' | awk '{print \$1}' | sort -u)\" = sealnode ]"
check "rootless: ctl status answers sealnode's own user" \
  sh -c "runuser -u sealnode -- /usr/bin/sealnode ctl --config /etc/sealnode/rootless.toml status >/dev/null"
runuser -u sealnode -- touch /var/lib/sealnode-rootless/node/x 2>/dev/null || true
check "rootless: systemctl stop returns" timeout 120 systemctl stop sealnode-rootless.service
check "rootless: a clean stop (Result=$(systemctl show -p Result --value sealnode-rootless.service))" \
  test "$(systemctl show -p Result --value sealnode-rootless.service)" = success
check "rootless: scratch wiped" sh -c "[ -z \"\$(ls -A /var/lib/sealnode-rootless/node)\" ]"
score=$(systemd-analyze security sealnode-rootless.service 2>/dev/null | sed -n 's/.*Overall exposure level for sealnode-rootless.service: \([0-9.]*\).*/\1/p')
echo "info: systemd-analyze security sealnode-rootless.service: $score"
check "an exposure score for the rootless unit" test -n "$score"

# Several nodes on one host: two instances of sealnode@.service at once, each its own user,
# config, dirs, gateway; the same engine port in both (each cell has its own namespaces).
mkdir -p /etc/sysusers.d
printf 'u sealnode-a - "sealnode instance a"\nu sealnode-b - "sealnode instance b"\n' > /etc/sysusers.d/sealnode-instances.conf
must "systemd-sysusers creates the instance users" systemd-sysusers /etc/sysusers.d/sealnode-instances.conf
for i in a b; do
  port=$([ $i = a ] && echo 18766 || echo 18767)
  sed -e "s#/var/lib/sealnode-rootless#/var/lib/sealnode-$i#g" -e "s#/run/sealnode-rootless\"#/run/sealnode-$i\"#" \
      -e "s#/etc/sealnode/credential#/etc/sealnode/$i.credential#" -e "s#$GW#$port#g" \
      /etc/sealnode/rootless.toml > /etc/sealnode/$i.toml
  chmod 0644 /etc/sealnode/$i.toml
  install -o sealnode-$i -g sealnode-$i -m 0400 /dev/null /etc/sealnode/$i.credential
  echo "credential-$i" > /etc/sealnode/$i.credential
  systemctl stop sealnode-vm-gw-$i 2>/dev/null; systemctl reset-failed sealnode-vm-gw-$i 2>/dev/null
  systemd-run --unit=sealnode-vm-gw-$i --service-type=exec -p StandardOutput=journal \
    "$PY" -u /usr/local/share/sealnode-standin/standin-gateway.py --port $port --model standin --timeout 400 >/dev/null 2>&1
done
sleep 1
must "sealnode@a and sealnode@b start together" timeout 400 systemctl start sealnode@a.service sealnode@b.service
for i in a b; do
  for _ in $(seq 1 240); do
    [ "$(systemctl show -p ActiveState --value sealnode-vm-gw-$i.service)" = active ] || break
    sleep 1
  done
  check "instance $i: a job round trip through its own gateway" \
    test "$(systemctl show -p Result --value sealnode-vm-gw-$i.service)" = success
  check "instance $i: sealnode runs as sealnode-$i" \
    test "$(ps -o uid= -p "$(systemctl show -p MainPID --value sealnode@$i.service)" | tr -d ' ')" = "$(id -u sealnode-$i)"
  check "instance $i: its receipt in its own state dir" test -s /var/lib/sealnode-$i/receipt.json
  check "instance $i: ctl status on its own control socket" \
    sh -c "runuser -u sealnode-$i -- /usr/bin/sealnode ctl --config /etc/sealnode/$i.toml status | grep -q '^sealnode: ready'"
  check "instance $i: its engine's lines in its own journal" \
    sh -c "journalctl -u sealnode@$i -t sealnode-engine --no-pager -o cat | grep -q ."
done
check "the two instances' engines run as their own users" \
  sh -c "[ \"\$(ps -eo uid=,args= | grep '[s]tandin-engine' | awk '{print \$1}' | sort -un | tr '\n' ' ')\" = \"\$(printf '%s\\n' \$(id -u sealnode-a) \$(id -u sealnode-b) | sort -un | tr '\n' ' ')\" ]"
check "instance a stops alone" timeout 120 systemctl stop sealnode@a.service
check "instance b still runs" test "$(systemctl show -p ActiveState --value sealnode@b.service)" = active
check "instance b: ctl status still answers" \
  sh -c "runuser -u sealnode-b -- /usr/bin/sealnode ctl --config /etc/sealnode/b.toml status | grep -q '^sealnode: ready'"
check "instance b stops" timeout 120 systemctl stop sealnode@b.service
check "instance a: a clean stop" test "$(systemctl show -p Result --value sealnode@a.service)" = success
check "instance b: a clean stop" test "$(systemctl show -p Result --value sealnode@b.service)" = success
score=$(systemd-analyze security sealnode@a.service 2>/dev/null | sed -n 's/.*Overall exposure level for sealnode@a.service: \([0-9.]*\).*/\1/p')
echo "info: systemd-analyze security sealnode@a.service: $score"
exit $failed

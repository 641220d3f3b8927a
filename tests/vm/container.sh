#!/bin/sh
# Runs INSIDE the test guest (scripts/vm run), as root: sealnode as a container's entrypoint.
# The image is scripts/build-image's (its rootfs tar, built on the host beside the package,
# imported here by podman), run with exactly the options docs/containers.md gives:
# - rootful podman (--userns=auto): doctor, the canary at start, a job round trip through
#   declared egress to a stand-in gateway in a second container on the same bridge, a fresh
#   statement whose predicate names the runtime, SIGTERM within 30 s with nothing left, and for
#   each option taken away a refusal (125) that names it, with no role started;
# - rootless podman (a user with subuids): the same image, start, job round trip to a gateway
#   on the guest's loopback (slirp4netns), stop;
# - containerd (ctr, the image imported from its OCI archive as the kubelet's runtime takes
#   it): the spec the kubelet makes for procMount: Unmasked, hostUsers: false and the
#   Localhost seccomp profile; start, canary, ready, statement naming containerd, SIGTERM.
# One line per check, "ok: ..." or "FAIL: ..."; exits 1 if any check failed.
#
#   tests/vm/container.sh REPO CACHE DEB     # the rootfs tar: DEB's dir/sealnode-rootfs.tar
set -u
REPO=$1 CACHE=$2 DEB=$3
# shellcheck source=tests/vm/checks.sh
. "$REPO/tests/vm/checks.sh"
# shellcheck disable=SC1091
. "$CACHE/env"
mkdir -p "$(dirname "$SEALNODE_TEST_PYTHON_PREFIX")"
ln -sfn "$SEALNODE_TEST_PYTHON" "$SEALNODE_TEST_PYTHON_PREFIX"
PY=$SEALNODE_TEST_VENV/bin/python
ROOTFS=$(dirname "$DEB")/sealnode-rootfs.tar
IMG=localhost/sealnode:0.1.0
GW=18765
W=/srv/sealnode-ctr
rm -rf "$W"; mkdir -p "$W"
# By hand, fewer parts: SEALNODE_VM_CONTAINER_PARTS="ctr" (default: all three).
PARTS=${SEALNODE_VM_CONTAINER_PARTS:-podman rootless ctr}
part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
echo "guest: $(uname -r); $(podman --version); $(crun --version | head -1); $(ctr --version)"

t0=$(date +%s)
must "the image imported from scripts/build-image's rootfs (podman import, OCI archive saved)" \
  sh -c "'$REPO/scripts/build-image' import '$ROOTFS' '$W/sealnode-oci.tar' > '$W/import.log' 2>&1"
echo "info: import and save took $(($(date +%s) - t0)) s"
must "the outer seccomp profile: podman's default plus deploy/seccomp/additions.json" \
  sh -c "'$REPO/scripts/container-seccomp' /usr/share/containers/seccomp.json > '$W/seccomp.json'"
# --userns=auto takes its ranges from the "containers" user's subordinate ids.
grep -q '^containers:' /etc/subuid || echo 'containers:2147483647:2147483648' >> /etc/subuid
grep -q '^containers:' /etc/subgid || echo 'containers:2147483647:2147483648' >> /etc/subgid

# The operator's part, on the host: the config, the credential, the state dir, the scratch
# dirs owned by the image's role users (uids 999 and 998 in the image), the stand-ins.
EU=$(podman run --rm --entrypoint /usr/bin/id "$IMG" -u sealnode-engine)
NU=$(podman run --rm --entrypoint /usr/bin/id "$IMG" -u sealnode-node)
check "the image has its role users (engine $EU, node $NU)" test -n "$EU" -a -n "$NU"
volumes() {  # DIR: the volumes under DIR, each a line
  mkdir -p "$1/config" "$1/cred" "$1/state" "$1/models" "$1/engine" "$1/node" "$1/standin"
  cp "$REPO/examples/demo/standin-engine.py" "$REPO/examples/demo/standin-gateway.py" "$1/standin/"
  echo "the stand-in engine loads no weights" > "$1/models/README"
  echo "container-credential" > "$1/cred/credential"
  chmod 0400 "$1/cred/credential"; chmod 0700 "$1/engine" "$1/node"
}
# shellcheck source=tests/vm/container-config.sh
. "$REPO/tests/vm/container-config.sh"
config() { container_config "$1/config/sealnode.toml" sealnode-ctr gateway.demo "$GW" "$2"; }  # DIR GATEWAY-ADDRESS
mounts() {  # DIR [VOLUME-OPTION]: podman's -v for each volume (",idmap" under --userns=auto)
  o=${2:-}
  echo "-v $1/config:/etc/sealnode:ro$o -v $1/cred:/etc/sealnode-credential:ro$o -v $1/state:/var/lib/sealnode${o:+:${o#,}}" \
       "-v $1/models:/var/lib/sealnode-models:ro$o -v $1/engine:/var/lib/sealnode-scratch/engine${o:+:${o#,}}" \
       "-v $1/node:/var/lib/sealnode-scratch/node${o:+:${o#,}} -v $1/standin:/opt/standin:ro$o"
}
# docs/containers.md's options, word for word.
SECCOMP="--security-opt seccomp=$W/seccomp.json"
UNMASK="--security-opt unmask=/proc/*"
CAPS="--cap-drop=all --cap-add=SETUID,SETGID,CHOWN,DAC_OVERRIDE,FOWNER,KILL"
USERNS="--userns=auto"
R=$W/rootful
volumes "$R"
chown "$EU:$EU" "$R/engine"; chown "$NU:$NU" "$R/node"; chown "$NU:$NU" "$R/cred/credential"
VOL=$(mounts "$R" ",idmap")

# --- rootful podman -------------------------------------------------------------------------
if part podman; then
podman network create sealnode-test >/dev/null 2>&1
# The gateway stand-in in a container of its own on the bridge: the image's Python has what it needs.
# shellcheck disable=SC2086
podman run -d --name gw --network sealnode-test $USERNS -v "$R/standin:/opt/standin:ro,idmap" \
  --entrypoint /opt/frutebox-node/bin/python "$IMG" -u /opt/standin/standin-gateway.py \
  --host 0.0.0.0 --port $GW --model standin --timeout 900 >/dev/null
GWIP=$(podman inspect -f '{{(index .NetworkSettings.Networks "sealnode-test").IPAddress}}' gw)
check "the gateway stand-in runs on the bridge ($GWIP)" test -n "$GWIP"
config "$R" "$GWIP:$GW"

# shellcheck disable=SC2086
out=$(timeout 120 podman run --rm $USERNS $SECCOMP $UNMASK $CAPS $VOL "$IMG" doctor 2>&1); code=$?
echo "$out" | sed -n '/container\|user namespaces\|proc fully\|capabilities/,+1p' | sed 's/^/info: doctor: /'
check "doctor in the container passes with the documented options (exit $code)" test "$code" = 0
check "doctor says it runs in podman" sh -c "echo \"\$1\" | grep -q '\[ok  \] container  *podman'" sh "$out"
suid=$(timeout 120 podman run --rm --entrypoint /usr/bin/find "$IMG" / -xdev -type f -perm /6000 2>&1)
check "the image has no setuid or setgid file (${suid:-none})" test -z "$suid"
# shellcheck disable=SC2086
must "attest init in the state volume" sh -c "timeout 120 podman run --rm $USERNS $SECCOMP $UNMASK $CAPS $VOL '$IMG' attest init --config /etc/sealnode/sealnode.toml > '$W/attest-init.txt' 2>&1"

t0=$(date +%s)
# shellcheck disable=SC2086
must "podman run -d with exactly the documented options" \
  sh -c "podman run -d --name cell --network sealnode-test $USERNS $SECCOMP $UNMASK $CAPS $VOL '$IMG' > /dev/null"
podman logs -f cell > /mnt/out/container-rootful.log 2>&1 &
ready() {  # CONTAINER [PODMAN...]: wait for `sealnode ctl ready` in it, up to 300 s
  c=$1; shift
  [ $# -gt 0 ] || set -- podman
  for _ in $(seq 1 150); do
    [ "$(timeout 30 "$@" inspect -f '{{.State.Running}}' "$c" 2>/dev/null)" = true ] || return 1
    timeout 30 "$@" exec "$c" /usr/bin/sealnode ctl ready > "$W/ready.txt" 2>&1 && return 0
    sleep 2
  done
  return 1
}
check "ctl ready in the container (readiness probe) once both roles run" ready cell
echo "info: rootful: run to ready in $(($(date +%s) - t0)) s"; sed 's/^/info: ctl ready: /' "$W/ready.txt" | tail -3
check "ctl status answers (liveness probe)" sh -c "timeout 30 podman exec cell /usr/bin/sealnode ctl status > '$W/status.txt'"
# What the outer profile withdraws from podman's default (deploy/seccomp/additions.json): the
# keyring and the new mount API, refused to a process exec'd in the container.
check "the outer profile refuses keyctl and open_tree to an exec'd process" timeout 30 podman exec cell /usr/bin/python3 -c '
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
# keyctl(KEYCTL_GET_KEYRING_ID, the session keyring) answers an id when allowed; open_tree(-1,
# NULL) EFAULT: past the filter. The filter answers ENOSYS or EPERM.
got = []
for n, args in ((250, (0, -3, 0)), (428, (-1, 0, 0))):
    r = libc.syscall(n, *args)
    got.append((r, ctypes.get_errno()))
print("info: keyctl, open_tree:", got)
sys.exit(0 if all(r == -1 and e in (1, 38) for r, e in got) else 1)'
check "the canary passed at this start (receipt)" \
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["canary"]["passed"] else 1)' "$R/state/receipt.json"
check "the receipt names podman as the container's runtime" \
  "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])).get("container") or {}; print("info: receipt container:", c); sys.exit(0 if c.get("runtime") == "podman" and "/run/.containerenv" in c.get("evidence", []) else 1)' "$R/state/receipt.json"
code=$(timeout 300 podman wait gw 2>/dev/null)
check "a job round trip through declared egress to the gateway's container (gateway exit $code)" test "$code" = 0
podman logs gw 2>&1 | grep "gateway:" | tail -3 | sed 's/^/info: /'
N=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
check "a fresh statement from the running cell" sh -c "timeout 60 podman exec cell /usr/bin/sealnode attest --nonce $N --config /etc/sealnode/sealnode.toml > '$W/statement.json'"
check "it verifies (examples/verify-attestation.py) for the nonce" \
  sh -c "'$PY' '$REPO/examples/verify-attestation.py' --pubkey '$R/state/attest/ed25519.pub' --nonce $N '$W/statement.json' > '$W/verify.txt' 2>&1"
check "its predicate says it ran in podman" "$PY" -c '
import base64, json, sys
st = json.loads(base64.b64decode(json.load(open(sys.argv[1]))["payload"]))
c = st["predicate"]["host"]["container"]
print("info: host.container:", c)
sys.exit(0 if c and c["runtime"] == "podman" else 1)' "$W/statement.json"
cp "$W/statement.json" /mnt/out/container-statement.json; cp "$R/state/attest/ed25519.pub" /mnt/out/container-pubkey.pem
echo "$N" > /mnt/out/container-nonce
touch "$R/node/left-behind" 2>/dev/null
t0=$(date +%s)
timeout 60 podman stop -t 30 cell >/dev/null
t=$(($(date +%s) - t0))
check "SIGTERM (podman stop) stops it within 30 s (took $t s)" test "$t" -le 30
code=$(podman inspect -f '{{.State.ExitCode}}' cell)
check "a clean stop: exit status 0 (got $code)" test "$code" = 0
check "nothing left running in the container" test "$(podman inspect -f '{{.State.Running}}' cell)" = false
check "scratch wiped" sh -c "[ -z \"\$(ls -A '$R/node')\" ] && [ -z \"\$(ls -A '$R/engine')\" ]"
podman rm -f cell gw >/dev/null 2>&1

# Each documented option taken away: refused with 125 before any role runs, naming it.
refused() {  # WHAT MUST-SAY OPTIONS...
  gone=$1 say=$2; shift 2
  # shellcheck disable=SC2086
  out=$(timeout 180 podman run --rm --network sealnode-test "$@" ${VOLS:-$VOL} "$IMG" 2>&1); c=$?
  echo "$out" | grep -A1 "sealnode:" | head -4 | sed "s|^|info: without $gone: |"
  check "without $gone: refused with 125 (got $c)" test "$c" = 125
  check "without $gone: the refusal names it ($say)" sh -c "echo \"\$1\" | grep -qF -- \"\$2\"" sh "$out" "$say"
  check "without $gone: no role started" sh -c "! echo \"\$1\" | grep -q 'role started'" sh "$out"
}
# shellcheck disable=SC2086
refused "the seccomp profile" "seccomp=FILE" $USERNS $UNMASK $CAPS
# shellcheck disable=SC2086
refused "unmask=/proc/*" "unmask=/proc/*" $USERNS $SECCOMP $CAPS
# shellcheck disable=SC2086
refused "the capabilities" "--cap-add" $USERNS $SECCOMP $UNMASK --cap-drop=all
# No user namespace for the container (or a privileged one): its root would be the host's,
# with /proc unmasked (the volumes without idmap, which needs one).
VOLS=$(mounts "$R")
# shellcheck disable=SC2086
refused "a user namespace" "--userns=auto" $SECCOMP $UNMASK $CAPS
# shellcheck disable=SC2086
refused "a user namespace, privileged" "--userns=auto" --privileged
VOLS=
fi

# --- rootless podman ------------------------------------------------------------------------
if part rootless; then
id podtest >/dev/null 2>&1 || useradd -m -u 1500 podtest
grep -q '^podtest:' /etc/subuid || echo 'podtest:100000:65536' >> /etc/subuid
grep -q '^podtest:' /etc/subgid || echo 'podtest:100000:65536' >> /etc/subgid
mkdir -p /run/user/1500 && chown podtest:podtest /run/user/1500 && chmod 0700 /run/user/1500
# podman as that user, a command (timeout runs it): no login session, so no systemd user
# manager; podman's own cgroupfs manager.
PU="runuser -u podtest -- env HOME=/home/podtest XDG_RUNTIME_DIR=/run/user/1500 podman --cgroup-manager=cgroupfs"
U=/home/podtest/sealnode
mkdir -p "$U"
volumes "$U"; chown -R podtest:podtest "$U"
config "$U" "10.0.2.2:$GW"
chown podtest:podtest "$U/config/sealnode.toml"
t0=$(date +%s)
# shellcheck disable=SC2086
must "rootless: podman load of the OCI archive" $PU load -q -i "$W/sealnode-oci.tar"
echo "info: rootless load took $(($(date +%s) - t0)) s"
# The role users' ids inside map to subordinate ids outside: hand them their dirs from inside.
$PU unshare sh -c "chown $EU:$EU '$U/engine' && chown $NU:$NU '$U/node' '$U/cred/credential'"
# The gateway on the guest's loopback; slirp4netns maps 10.0.2.2 in the container to it.
systemd-run --unit=sealnode-ctr-gateway --service-type=exec "$PY" -u "$U/standin/standin-gateway.py" \
  --host 127.0.0.1 --port $GW --model standin --timeout 900 >/dev/null 2>&1
RVOL=$(mounts "$U")
# shellcheck disable=SC2086
must "rootless: podman run -d with the documented options" \
  $PU run -d --name cell --network slirp4netns:allow_host_loopback=true \
  $SECCOMP $UNMASK $CAPS $RVOL "$IMG"
$PU logs -f cell > /mnt/out/container-rootless.log 2>&1 &
# shellcheck disable=SC2086
check "rootless: ctl ready in the container" ready cell $PU
check "rootless: the canary passed and the receipt names podman" \
  "$PY" -c 'import json,sys; r=json.load(open(sys.argv[1])); c=r.get("container") or {}; print("info: receipt container:", c); sys.exit(0 if r["canary"]["passed"] and c.get("runtime") == "podman" else 1)' "$U/state/receipt.json"
for _ in $(seq 1 240); do [ "$(systemctl show -p ActiveState --value sealnode-ctr-gateway)" = active ] || break; sleep 1; done
check "rootless: a job round trip through declared egress (gateway result: $(systemctl show -p Result --value sealnode-ctr-gateway))" \
  test "$(systemctl show -p Result --value sealnode-ctr-gateway)" = success
t0=$(date +%s)
# shellcheck disable=SC2086
timeout 60 $PU stop -t 30 cell >/dev/null
t=$(($(date +%s) - t0))
# shellcheck disable=SC2086
code=$($PU inspect -f '{{.State.ExitCode}}.{{.State.Running}}' cell)
check "rootless: SIGTERM stops it within 30 s (took $t s), exit 0, not running (got $code)" test "$t" -le 30 -a "$code" = 0.false
# shellcheck disable=SC2086
$PU rm -f cell >/dev/null 2>&1
systemctl stop sealnode-ctr-gateway 2>/dev/null
fi

# --- containerd ------------------------------------------------------------------------------
# The kubelet hands containerd a spec: the pod's user namespace (hostUsers: false), the
# Localhost seccomp profile, the capabilities, and for procMount: Unmasked no masked or
# read-only /proc paths. ctr makes the first two from its flags; the spec it made is then
# taken with the capabilities and /proc unmasked, as the kubelet's would be.
part ctr || exit $failed
systemctl start containerd
C=$W/ctr
volumes "$C"
config "$C" "127.0.0.1:$GW"
# Inside the pod's user namespace container ids 0..65535 are host ids 200000.. (--uidmap).
chown -R 200000:200000 "$C"; chown $((200000 + EU)):$((200000 + EU)) "$C/engine"
chown $((200000 + NU)):$((200000 + NU)) "$C/node" "$C/cred/credential"
t0=$(date +%s)
must "ctr images import of the OCI archive" sh -c "ctr -n sealnode images import --snapshotter overlayfs '$W/sealnode-oci.tar' > '$W/ctr-import.txt' 2>&1"
echo "info: ctr import took $(($(date +%s) - t0)) s"
REF=$(ctr -n sealnode images ls -q | grep sealnode | head -1)
check "the image is in containerd's store ($REF)" test -n "$REF"
CM=""
for m in "config:/etc/sealnode:ro" "cred:/etc/sealnode-credential:ro" "state:/var/lib/sealnode:rw" "models:/var/lib/sealnode-models:ro" \
         "engine:/var/lib/sealnode-scratch/engine:rw" "node:/var/lib/sealnode-scratch/node:rw" "standin:/opt/standin:ro"; do
  src=${m%%:*} rest=${m#*:}; dst=${rest%:*} mode=${rest##*:}
  CM="$CM --mount type=bind,src=$C/$src,dst=$dst,options=rbind:$mode"
done
# shellcheck disable=SC2086
# Generous bounds: under emulation, beside a busy host, the first run of an image (its
# snapshot prepared) has taken over a minute.
t0=$(date +%s)
timeout 300 ctr -n sealnode run -d --uidmap 0:200000:65536 --gidmap 0:200000:65536 --seccomp --seccomp-profile "$W/seccomp.json" \
  $CM "$REF" spec-probe /bin/sleep 600 > "$W/ctr-probe.txt" 2>&1
echo "ctr run exited $? after $(($(date +%s) - t0)) s" >> "$W/ctr-probe.txt"
B=/run/containerd/io.containerd.runtime.v2.task/sealnode/spec-probe/config.json
for _ in $(seq 1 120); do [ -f "$B" ] && break; sleep 1; done
if ! test -f "$B"; then
  bad "ctr made the spec (the pod's user namespace, seccomp)"
  sed 's/^/info: ctr run: /' "$W/ctr-probe.txt"
  ctr -n sealnode containers ls 2>&1 | sed 's/^/info: ctr containers: /'
  ctr -n sealnode tasks ls 2>&1 | sed 's/^/info: ctr tasks: /'
  journalctl -u containerd --no-pager | tail -15 | sed 's/^/info: containerd: /'
  exit 1
fi
ok "ctr made the spec (the pod's user namespace, seccomp)"
"$PY" - "$B" "$W/ctr-spec.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
l = s["linux"]
l["maskedPaths"] = [p for p in l.get("maskedPaths", []) if not p.startswith("/proc")]
l["readonlyPaths"] = [p for p in l.get("readonlyPaths", []) if not p.startswith("/proc")]
s["process"]["args"] = ["/usr/bin/sealnode", "run", "--config", "/etc/sealnode/sealnode.toml"]
# capabilities: {drop: [ALL], add: [...]}, as the kubelet writes it (docs/containers.md).
caps = ["CAP_" + c for c in "SETUID SETGID CHOWN DAC_OVERRIDE FOWNER KILL".split()]
s["process"]["capabilities"] = {"bounding": caps, "effective": caps, "permitted": caps}
# ctr's default spec caps open files at 1024; the kubelet's containers get containerd's own
# limit (its unit: 1048576), which the config's rlimits (nofile 4096) fit under.
s["process"]["rlimits"] = [r for r in s["process"].get("rlimits", []) if r["type"] != "RLIMIT_NOFILE"] + \
    [{"type": "RLIMIT_NOFILE", "hard": 1048576, "soft": 1048576}]
json.dump(s, open(sys.argv[2], "w"))
EOF
ctr -n sealnode task kill -s KILL spec-probe 2>/dev/null; sleep 2; ctr -n sealnode task rm -f spec-probe 2>/dev/null
# A spec given whole names its root by path: the probe's snapshot (the image, its owners
# shifted into the pod's user namespace), mounted.
mkdir -p "$W/ctr-rootfs"
ctr -n sealnode snapshots mounts "$W/ctr-rootfs" spec-probe | sh
"$PY" -c 'import json, sys; s = json.load(open(sys.argv[1])); s["root"] = {"path": sys.argv[2]}; json.dump(s, open(sys.argv[1], "w"))' \
  "$W/ctr-spec.json" "$W/ctr-rootfs"
systemd-run --unit=sealnode-ctr-cell --service-type=exec -p StandardOutput=file:/mnt/out/container-ctr.log -p StandardError=inherit \
  ctr -n sealnode run --config "$W/ctr-spec.json" cell >/dev/null 2>&1
check "containerd: ctl ready in the container" sh -c '
for _ in $(seq 1 150); do
  timeout 30 ctr -n sealnode task exec --exec-id r$$_$_ cell /usr/bin/sealnode ctl ready >/dev/null 2>&1 && exit 0
  sleep 2
done; exit 1'
check "containerd: the canary passed and the receipt names containerd" "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1])); c = r.get("container") or {}
print("info: receipt container:", c)
sys.exit(0 if r["canary"]["passed"] and c.get("runtime") == "containerd" else 1)' "$C/state/receipt.json"
t0=$(date +%s)
ctr -n sealnode task kill -s TERM cell
for _ in $(seq 1 40); do [ "$(systemctl show -p ActiveState --value sealnode-ctr-cell)" = active ] || break; sleep 1; done
t=$(($(date +%s) - t0))
check "containerd: SIGTERM stops it within 30 s (took $t s)" test "$t" -le 30
check "containerd: nothing left running" sh -c "! ctr -n sealnode task ls | grep -q RUNNING"
tail -5 /mnt/out/container-ctr.log | sed 's/^/info: ctr: /'
exit $failed

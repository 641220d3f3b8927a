#!/bin/sh
# Runs INSIDE the test guest (bench/container.sh boots it): sealnode in a rootful podman
# container (docs/containers.md's options, word for word) against sealnode on the guest's own
# host, the same package, the same frutebox-node venv (the image's, unpacked on the host) and
# the same stand-in engine. Two numbers, side by side in one run:
# - start to ready: `sealnode run` (or `podman run`) launched -> its log says the node
#   started (both roles up: the engine answered, both passed the gate), ROUNDS_START times
#   each, alternating host and container; each cell stopped before the next starts;
# - a job's latency: both cells up at once, one benchmark gateway (bench/job-gateway.py) on the
#   guest sends both nodes the same jobs, one in flight at a time, alternating order.
# Prints a markdown report (also /mnt/out/container-bench.md) and the raw rows.
#
#   bench/container-guest.sh REPO CACHE DEB [ROUNDS_START (5)] [ROUNDS_JOB (20)]
set -u
REPO=$1 CACHE=$2 DEB=$3
ROUNDS_START=${4:-5}; ROUNDS_JOB=${5:-20}; GW=18770
# shellcheck disable=SC1091
. "$CACHE/env"
SEALNODE_VM_SETUP_ONLY=1 sh "$REPO/tests/vm/unit.sh" "$REPO" "$CACHE" "$DEB" >/dev/null || { echo "bench: package setup failed"; exit 1; }
PY=/opt/frutebox-node/bin/python
ROOTFS=$(dirname "$DEB")/sealnode-rootfs.tar
IMG=localhost/sealnode:0.1.0
W=/srv/sealnode-bench
rm -rf "$W"; mkdir -p "$W"
die() { echo "bench: $*"; exit 1; }
"$REPO/scripts/build-image" import "$ROOTFS" "$W/sealnode-oci.tar" > "$W/import.log" 2>&1 || die "image import: $(tail -5 "$W/import.log")"
"$REPO/scripts/container-seccomp" /usr/share/containers/seccomp.json > "$W/seccomp.json" || die "seccomp profile"
grep -q '^containers:' /etc/subuid || echo 'containers:2147483647:2147483648' >> /etc/subuid
grep -q '^containers:' /etc/subgid || echo 'containers:2147483647:2147483648' >> /etc/subgid
# The host's copy of the image's venv: the same Python (Debian's) and frutebox-node on both sides.
tar -C / -xf "$ROOTFS" ./opt/frutebox-node || die "the image's venv"
podman network create sealnode-bench >/dev/null 2>&1
BRIDGE=$(podman network inspect sealnode-bench -f '{{range .Subnets}}{{.Gateway}}{{end}}')
[ -n "$BRIDGE" ] || die "no bridge address"

# shellcheck source=tests/vm/container-config.sh
. "$REPO/tests/vm/container-config.sh"
# One cell's files under DIR (credential, state, models, the stand-in, scratch dirs owned by
# the role users ENGINE_UID and NODE_UID) and its config: on the host naming DIR's files, in
# the container where its volumes put them.
cell() {  # DIR ID CONNECT host|ctr ENGINE_UID NODE_UID
  d=$1
  mkdir -p "$d/config" "$d/cred" "$d/state" "$d/models" "$d/engine" "$d/node" "$d/standin"
  cp "$REPO/examples/demo/standin-engine.py" "$d/standin/"
  echo "the stand-in engine loads no weights" > "$d/models/README"
  echo "bench-credential" > "$d/cred/credential"
  chmod 0400 "$d/cred/credential"; chmod 0700 "$d/engine" "$d/node" "$d/state"
  chown "$5:$5" "$d/engine"; chown "$6:$6" "$d/node" "$d/cred/credential"
  container_config "$d/config/sealnode.toml" "$2" gateway.bench "$GW" "$3:$GW" "$([ "$4" = host ] && echo "$d")"
}
H=$W/host
cell "$H" sealnode-host 127.0.0.1 host "$(id -u sealnode-engine)" "$(id -u sealnode-node)"
EU=$(podman run --rm --entrypoint /usr/bin/id "$IMG" -u sealnode-engine)
NU=$(podman run --rm --entrypoint /usr/bin/id "$IMG" -u sealnode-node)
C=$W/ctr
cell "$C" sealnode-ctr "$BRIDGE" ctr "$EU" "$NU"
VOL="-v $C/config:/etc/sealnode:ro,idmap -v $C/cred:/etc/sealnode-credential:ro,idmap -v $C/state:/var/lib/sealnode:idmap
 -v $C/models:/var/lib/sealnode-models:ro,idmap -v $C/engine:/var/lib/sealnode-scratch/engine:idmap
 -v $C/node:/var/lib/sealnode-scratch/node:idmap -v $C/standin:/opt/standin:ro,idmap"
OPTS="--userns=auto --security-opt seccomp=$W/seccomp.json --security-opt unmask=/proc/* --cap-drop=all --cap-add=SETUID,SETGID,CHOWN,DAC_OVERRIDE,FOWNER,KILL"

now_ms() { echo $(($(date +%s%N) / 1000000)); }
up() {  # LOG: wait up to 300 s for the node's start in LOG
  for _ in $(seq 1 3000); do grep -q "role started role=node" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}
start_host() { /usr/bin/sealnode run --config "$H/config/sealnode.toml" > "$1" 2>&1 & hpid=$!; }
stop_host() { kill -TERM "$hpid"; wait "$hpid"; }
# shellcheck disable=SC2086
start_ctr() { podman run --rm --name bench --network sealnode-bench $OPTS $VOL "$IMG" > "$1" 2>&1 & cpid=$!; }
stop_ctr() { podman stop -t 30 bench >/dev/null; wait "$cpid"; }

echo "guest: $(uname -r); $(podman --version); $(nproc) CPU"
# Start to ready, alternating: host first in odd rounds, the container first in even ones.
: > "$W/start.txt"
for r in $(seq 1 "$ROUNDS_START"); do
  order="host ctr"; [ $((r % 2)) = 0 ] && order="ctr host"
  for side in $order; do
    log=$W/start-$side-$r.log; t0=$(now_ms)
    "start_$side" "$log"
    up "$log" || { tail -20 "$log"; die "$side: no start in round $r"; }
    echo "$side $r $(($(now_ms) - t0))" >> "$W/start.txt"
    "stop_$side"
  done
done

# Jobs: both cells up, one gateway for both.
"$PY" -u "$REPO/bench/job-gateway.py" --host 0.0.0.0 --port "$GW" --nodes sealnode-host,sealnode-ctr --model standin \
  --rounds "$ROUNDS_JOB" --timeout 600 > "$W/jobs.jsonl" & gw=$!
start_host "$W/jobs-host.log"; start_ctr "$W/jobs-ctr.log"
wait "$gw"; code=$?
stop_host; stop_ctr
[ "$code" = 0 ] || die "the job gateway failed ($code): $(tail -5 "$W/jobs-host.log" "$W/jobs-ctr.log")"

"$PY" - "$W/start.txt" "$W/jobs.jsonl" "$ROUNDS_START" "$ROUNDS_JOB" <<'PY' | tee /mnt/out/container-bench.md
import json, statistics, sys
start = [l.split() for l in open(sys.argv[1])]
rows = [json.loads(l) for l in open(sys.argv[2])]
med = statistics.median
s = {k: [int(ms) for side, _, ms in start if side == k] for k in ("host", "ctr")}
print(f"### container vs host in the guest: start to ready ({sys.argv[3]} starts each, alternating) and job latency ({sys.argv[4]} rounds, interleaved)")
print("| metric | host | container | container ÷ host | median per-round ratio |")
print("|---|---:|---:|---:|---:|")
pr = [c / h for h, c in zip(s["host"], s["ctr"])]
print(f"| start to ready, median ms | {med(s['host'])} | {med(s['ctr'])} | {med(s['ctr']) / med(s['host']):.3f} | {med(pr):.3f} |")
for stream in (True, False):
    by = {n: {r["round"]: r["latency_ms"] for r in rows if r["node"] == n and r["stream"] == stream} for n in ("sealnode-host", "sealnode-ctr")}
    h, c = list(by["sealnode-host"].values()), list(by["sealnode-ctr"].values())
    ratios = [by["sealnode-ctr"][k] / by["sealnode-host"][k] for k in by["sealnode-host"] if k in by["sealnode-ctr"]]
    name = "streamed" if stream else "plain"
    print(f"| {name} job latency, median ms | {med(h):.1f} | {med(c):.1f} | {med(c) / med(h):.3f} | {med(ratios):.3f} |")
print()
print("raw starts (side round ms):", " ".join("/".join(x) for x in start))
PY

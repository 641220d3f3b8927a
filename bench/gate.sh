#!/usr/bin/env bash
# The gate's measurement off the event loop (docs/attestation.md, "What the digests are of"): a
# sparse SIZE_GB (default 16) GiB model appears and the engine restarts, so its gate hashes it;
# meanwhile `status` requests are timed on the control socket every 20 ms, and the watchdog's
# WATCHDOG=1 datagrams on a notify socket. The anchors, in the same run: the same requests on
# the idle cell before, and coreutils' sha256sum of the same file (how long the hash itself takes).
. "$(dirname "$0")/common.sh"
SIZE_GB=${SIZE_GB:-16}
D=$BENCH/gate
write_fixture "$D" rootful
cp /usr/bin/busybox "$BENCH/bin/busybox" && chmod 0755 "$BENCH/bin/busybox"
# The engine serves until models/go appears, then exits 3 once (its restart is the gate measured).
ENGINE='if [ ! -e /scratch/crashed ]; then : > /scratch/crashed; /opt/bench/busybox httpd -f -p 127.0.0.1:18080 -h /models & while [ ! -e /models/go ]; do sleep 0.05; done; exit 3; fi; exec /opt/bench/busybox httpd -f -p 127.0.0.1:18080 -h /models'
python3 - "$D/c.toml" "$ENGINE" <<'PY'
import json, sys
p, engine = sys.argv[1], sys.argv[2]
t = open(p).read()
t = t.replace('command = ["/usr/bin/true"]\nport = 18080', 'command = ["/opt/bench/busybox", "sh", "-c", %s]\nport = 18080\nrestart = "on-failure"' % json.dumps(engine), 1)
t = t.replace('command = ["/usr/bin/true"]', 'command = ["/opt/bench/busybox", "sleep", "100000"]', 1)
open(p, "w").write(t)
PY
echo "hello" > "$D/models/hello.txt"
rm -rf "$D/state/attest"; "$SN" attest init --config "$D/c.toml" >/dev/null
rm -f "$D/state/model-digests.json"
NOTIFY=$D/notify.sock; rm -f "$NOTIFY"
python3 - "$D" "$SN" "$SIZE_GB" <<'PY'
import os, socket, statistics, subprocess, sys, threading, time
d, sn, gb = sys.argv[1], sys.argv[2], int(sys.argv[3])
notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM); notify.bind(f"{d}/notify.sock")
pings = []
def listen():
    while True:
        m = notify.recv(4096).decode()
        if "WATCHDOG=1" in m:
            pings.append(time.monotonic())
threading.Thread(target=listen, daemon=True).start()
env = dict(os.environ, NOTIFY_SOCKET=f"{d}/notify.sock", WATCHDOG_USEC="1000000")
log = open(f"{d}/run.log", "w")
run = subprocess.Popen(["sh", "-c", 'export WATCHDOG_PID=$$; exec "$0" run --config "$1"', sn, f"{d}/c.toml"], env=env, stdout=log, stderr=log)
def logged(what):
    return what in open(f"{d}/run.log").read()
def status():
    t = time.monotonic()
    s = socket.socket(socket.AF_UNIX); s.connect(f"{d}/run/control.sock"); s.sendall(b'{"cmd":"status"}\n')
    data = b""
    while not data.endswith(b"\n"):
        data += s.recv(65536)
    return time.monotonic() - t, b'"gate":{' in data
while not logged("role started role=node"):
    time.sleep(0.1)
idle = []
for _ in range(200):
    idle.append(status()[0]); time.sleep(0.02)
with open(f"{d}/models/big.gguf", "wb") as f:
    f.truncate(gb << 30)
t0 = time.monotonic()
open(f"{d}/models/go", "w").close()
during, before = [], False
while not logged(f"hashed_bytes={gb << 30}"):
    took, gating = status()
    if gating and before:
        during.append(took)
    before = gating
    time.sleep(0.02)
hashed = time.monotonic() - t0
window = [p for p in pings if t0 <= p <= t0 + hashed]
gaps = [b - a for a, b in zip(window, window[1:])]
t = time.monotonic(); subprocess.run(["sha256sum", f"{d}/models/big.gguf"], stdout=subprocess.DEVNULL, check=True); anchor = time.monotonic() - t
run.terminate(); run.wait(60)
q = lambda v, p: sorted(v)[min(len(v) - 1, int(len(v) * p))] * 1000
print(f"### gate: a sparse {gb} GiB model hashed at an engine restart (release build)")
print()
print("| | answers | median | p99 | max |")
print("|---|---:|---:|---:|---:|")
print(f"| `status` on the idle cell (anchor) | {len(idle)} | {q(idle, .5):.2f} ms | {q(idle, .99):.2f} ms | {max(idle) * 1000:.2f} ms |")
print(f"| `status` while the gate hashes | {len(during)} | {q(during, .5):.2f} ms | {q(during, .99):.2f} ms | {max(during) * 1000:.2f} ms |")
print()
print(f"The hash took {hashed:.1f} s (sha256sum of the same file, the anchor: {anchor:.1f} s); the watchdog "
      f"(1 s, pinged every 0.5 s) sent {len(window)} pings meanwhile, the longest gap {max(gaps) if gaps else 0:.2f} s.")
PY
rm -f "$D/models/big.gguf"

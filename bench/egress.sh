#!/usr/bin/env bash
# Egress forwarder: throughput (iperf3, 5 s) and latency (64-byte ping-pong: round trips on one
# connection, and connect + one round trip) from inside the cell's node role through sealnode's
# forwarder to a server on the host, against the same client directly on the host's loopback and
# through socat forwarding the same hop. Not pinned (throughput needs both CPUs). As root.
. "$(dirname "$0")/common.sh"
SECS=${SECS:-5}; RT=${RT:-5000}; CN=${CN:-1000}
IP=5201; PP=5301
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
pids=(); trap cleanup EXIT
iperf3 -s -p $IP >/dev/null 2>&1 & pids+=($!)
"$BENCH/bin/pingpong" serve $PP & pids+=($!)
socat TCP-LISTEN:5202,reuseaddr,fork TCP:127.0.0.1:$IP & pids+=($!)
socat TCP-LISTEN:5302,reuseaddr,fork TCP:127.0.0.1:$PP & pids+=($!)
sleep 0.5
gbps() { python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); print("%.1f" % (d["end"]["sum_received"]["bits_per_second"]/1e9))'; }
direct_bw=$(iperf3 -c 127.0.0.1 -p $IP -t "$SECS" -J | gbps)
direct_rt=$("$BENCH/bin/pingpong" rtt 127.0.0.1 $PP "$RT")
direct_cn=$("$BENCH/bin/pingpong" connect 127.0.0.1 $PP "$CN")
socat_bw=$(iperf3 -c 127.0.0.1 -p 5202 -t "$SECS" -J | gbps)
socat_rt=$("$BENCH/bin/pingpong" rtt 127.0.0.1 5302 "$RT")
socat_cn=$("$BENCH/bin/pingpong" connect 127.0.0.1 5302 "$CN")
# Inside the cell: egress upstream 0 (iperf3) is 127.0.0.2, upstream 1 (ping-pong) 127.0.0.3.
extra="egress = [{ host = \"iperf.bench\", port = $IP, connect = \"127.0.0.1:$IP\" }, { host = \"pp.bench\", port = $PP, connect = \"127.0.0.1:$PP\" }]"
write_fixture "$BENCH/egress" rootful "$extra"
# iperf3 needs four calls the node's fitted filter (fitted to frutebox-node) does not allow
# (found with strace): pselect6 to wait, and a temp file for its data buffer (unlink, ftruncate),
# getrusage for its report. The bench's node policy adds exactly these; the forwarder measured
# is the same.
python3 - "$BENCH/pol/node.json" "$BENCH/pol/node-iperf.json" <<'PY'
import json, sys
src, dst = sys.argv[1:]
d = json.load(open(src))
for c in ["pselect6", "unlink", "ftruncate", "getrusage"]:
    d["node"]["filter"].append({"syscall": c, "comment": "bench only: iperf3"})
json.dump(d, open(dst, "w"), indent=1)
PY
sed -i "s|seccomp = \"$BENCH/pol/node.json\"|seccomp = \"$BENCH/pol/node-iperf.json\"|" "$BENCH/egress/c.toml"
sed -i 's|^command = \["/usr/bin/true"\]\nport|X|' "$BENCH/egress/c.toml"
python3 - "$BENCH/egress/c.toml" "$SECS" "$RT" "$CN" <<'PY'
import sys
p, secs, rt, cn = sys.argv[1:]
s = open(p).read()
engine = '["/usr/bin/busybox", "httpd", "-f", "-p", "127.0.0.1:18080", "-h", "/models"]'
node = ('["/bin/sh", "-c", "iperf3 -c 127.0.0.2 -p 5201 -t %s -J > /scratch/iperf.json; '
        'echo IPERF $(tr -d \'\\\\n\' < /scratch/iperf.json); /opt/bench/pingpong rtt 127.0.0.3 5301 %s; '
        '/opt/bench/pingpong connect 127.0.0.3 5301 %s; echo BENCH-DONE; exec sleep 1000"]') % (secs, rt, cn)
first, rest = s.split('command = ["/usr/bin/true"]', 1)
s = first + 'command = ' + engine + rest.replace('command = ["/usr/bin/true"]', 'command = ' + node, 1)
open(p, 'w').write(s)
PY
out=$(mktemp)
"$SN" run --config "$BENCH/egress/c.toml" > "$out" 2>/dev/null & run=$!
for _ in $(seq 1 $((SECS * 10 + 300))); do grep -q BENCH-DONE "$out" && break; sleep 0.1; done
kill -TERM $run; wait $run || true
sn_bw=$(grep '^IPERF ' "$out" | sed 's/^IPERF //' | gbps)
sn_rt=$(grep '^median' "$out" | sed -n 1p)
sn_cn=$(grep '^median' "$out" | sed -n 2p)
rm -f "$out"
echo "### egress: node in the cell -> forwarder -> server on the host"
echo "| path | throughput (iperf3, ${SECS} s) | 64-byte round trip | connect + round trip |"
echo "|---|---:|---:|---:|"
echo "| direct loopback (no sandbox) | $direct_bw Gbit/s | $direct_rt | $direct_cn |"
echo "| socat forwarding the same hop | $socat_bw Gbit/s | $socat_rt | $socat_cn |"
echo "| sealnode egress (from the sealed node) | $sn_bw Gbit/s | $sn_rt | $sn_cn |"

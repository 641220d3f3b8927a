#!/usr/bin/env bash
# The node's hop to the engine (#13: each role its own network namespace): the node reaches
# 127.0.0.1:<engine.port> in its namespace, and sealnode forwards that connection into the
# engine's namespace. 64-byte ping-pong (round trips on one connection; connect + one round
# trip) from the sealed node to a server sealed as the engine, against the same client and
# server directly on the host's loopback and through socat forwarding the same hop. As root.
. "$(dirname "$0")/common.sh"
RT=${RT:-5000}; CN=${CN:-1000}
PP=5401
cleanup() { kill "${pids[@]}" 2>/dev/null || true; }
pids=(); trap cleanup EXIT
"$BENCH/bin/pingpong" serve $PP & pids+=($!)
socat TCP-LISTEN:5402,reuseaddr,fork TCP:127.0.0.1:$PP & pids+=($!)
sleep 0.5
direct_rt=$("$BENCH/bin/pingpong" rtt 127.0.0.1 $PP "$RT")
direct_cn=$("$BENCH/bin/pingpong" connect 127.0.0.1 $PP "$CN")
socat_rt=$("$BENCH/bin/pingpong" rtt 127.0.0.1 5402 "$RT")
socat_cn=$("$BENCH/bin/pingpong" connect 127.0.0.1 5402 "$CN")
write_fixture "$BENCH/engine-hop" rootful
python3 - "$BENCH/engine-hop/c.toml" "$RT" "$CN" <<'PY'
import sys
p, rt, cn = sys.argv[1:]
s = open(p).read()
engine = '["/opt/bench/pingpong", "serve", "18080"]'
node = ('["/bin/sh", "-c", "/opt/bench/pingpong rtt 127.0.0.1 18080 %s; '
        '/opt/bench/pingpong connect 127.0.0.1 18080 %s; echo BENCH-DONE; exec sleep 1000"]') % (rt, cn)
first, rest = s.split('command = ["/usr/bin/true"]', 1)
s = first + 'command = ' + engine + rest.replace('command = ["/usr/bin/true"]', 'command = ' + node, 1)
open(p, 'w').write(s)
PY
out=$(mktemp)
"$SN" run --config "$BENCH/engine-hop/c.toml" > "$out" 2>/dev/null & run=$!
for _ in $(seq 1 600); do grep -q BENCH-DONE "$out" && break; sleep 0.1; done
kill -TERM $run; wait $run || true
sn_rt=$(grep '^median' "$out" | sed -n 1p)
sn_cn=$(grep '^median' "$out" | sed -n 2p)
rm -f "$out"
echo "### node -> engine: the sealed node to a server sealed as the engine"
echo "| path | 64-byte round trip | connect + round trip |"
echo "|---|---:|---:|"
echo "| direct loopback (no sandbox) | $direct_rt | $direct_cn |"
echo "| socat forwarding the same hop | $socat_rt | $socat_cn |"
echo "| sealnode: node's 127.0.0.1:18080 -> engine's namespace | $sn_rt | $sn_cn |"

#!/usr/bin/env bash
# Inference under the sandbox: llama-server (-t 1) with the SmolLM2-135M model, bare on the host
# and sealed as the engine role of `sealnode run`, both up at once. One client, sealed in the node
# role, sends each round one request to each (order alternating): the sealed engine through the
# node-to-engine hop, the bare one through a declared egress. The numbers are llama-server's own
# timings, so neither hop is in them; interleaving keeps the machine's drift out of the ratio.
# Needs scripts/build-llama-server and scripts/prepare-python (their env files are sourced).
. "$(dirname "$0")/common.sh"
N=${N:-24}
LLM=${SEALNODE_LLM_DIR:-/var/tmp/sealnode-llm}; PYD=${SEALNODE_TEST_CACHE:-/var/tmp/sealnode-test}
"$REPO/scripts/build-llama-server" "$LLM" >/dev/null; . "$LLM/env"
"$REPO/scripts/prepare-python" "$PYD" >/dev/null; . "$PYD/env"
install -m 0644 "$REPO/bench/llama-client.py" "$BENCH/bin/"
d=$BENCH/inference
write_fixture "$d" rootful
ln -f "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf" 2>/dev/null || cp "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf"
python3 - "$d/c.toml" "$(dirname "$SEALNODE_TEST_LLAMA_SERVER")" "$SEALNODE_TEST_PYTHON" "$SEALNODE_TEST_PYTHON_PREFIX" "$SEALNODE_TEST_VENV" "$N" <<'PY'
import sys
p, bindir, pycopy, prefix, venv, n = sys.argv[1:]
s = open(p).read()
engine = '["/opt/llama/llama-server", "-m", "/models/smollm2.gguf", "--host", "127.0.0.1", "--port", "18080", "-t", "1", "-c", "2048"]'
node = f'["{venv}/bin/python", "-I", "/opt/bench/llama-client.py", "{n}", "bare=http://bare.bench:18181", "sealed=http://127.0.0.1:18080"]'
a, b = s.split('command = ["/usr/bin/true"]', 1)
b = b.replace('command = ["/usr/bin/true"]', 'command = ' + node, 1)
s = a + 'command = ' + engine + b
s = s.replace('ro_binds = [{ src = "', f'ready = {{ kind = "http", path = "/health", timeout_s = 120 }}\nro_binds = [{{ src = "{bindir}", dst = "/opt/llama" }}, {{ src = "', 1)
node_binds = f'ro_binds = [{{ src = "{pycopy}", dst = "{prefix}" }}, {{ src = "{venv}" }}, {{ src = "'
i = s.index('[node]')
s = s[:i] + s[i:].replace('ro_binds = [{ src = "', node_binds, 1)
s += '\negress = [{ host = "bare.bench", port = 18181, connect = "127.0.0.1:18181" }]\n'
open(p, 'w').write(s)
PY
"$SEALNODE_TEST_LLAMA_SERVER" -m "$SEALNODE_TEST_MODEL" --host 127.0.0.1 --port 18181 -t 1 -c 2048 >/dev/null 2>&1 & bare=$!
trap 'kill $bare 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18181/health 2>/dev/null | grep -q 200 && break; sleep 0.1; done
out=$("$SN" run --config "$d/c.toml" 2>/dev/null | head -n $((2 * N)) || true)
pkill -f "sealnode run --config $d/c.toml" 2>/dev/null || true
echo "$out" | python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
med = lambda e, k: statistics.median(r[k] for r in rows if r["engine"] == e)
cnt = lambda e: sum(1 for r in rows if r["engine"] == e)
rng = lambda e, k: "%.1f–%.1f" % (min(r[k] for r in rows if r["engine"] == e), max(r[k] for r in rows if r["engine"] == e))
# Per-round ratios: each round holds one request to each engine, close together in time.
rounds = {}
for r in rows:
    rounds.setdefault(r["round"], {})[r["engine"]] = r
pr = [x["sealed"]["tokens_per_s"] / x["bare"]["tokens_per_s"] for x in rounds.values() if len(x) == 2]
print("### inference: llama-server -t 1, SmolLM2-135M Q4_1, 64 tokens per request, interleaved")
print("| engine | requests | median tokens/s (min–max) | median prompt time (≈ time to first token) |")
print("|---|---:|---:|---:|")
for e, name in (("bare", "bare"), ("sealed", "sealed (sealnode run, engine role)")):
    print("| %s | %d | %.1f (%s) | %.1f ms |" % (name, cnt(e), med(e, "tokens_per_s"), rng(e, "tokens_per_s"), med(e, "prompt_ms")))
print("| ratio sealed/bare | | %.3f (median of per-round ratios %.3f, %d rounds) | %.3f |" % (
    med("sealed", "tokens_per_s") / med("bare", "tokens_per_s"), statistics.median(pr), len(pr),
    med("sealed", "prompt_ms") / med("bare", "prompt_ms")))'

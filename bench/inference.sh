#!/usr/bin/env bash
# Inference under the sandbox: llama-server (-t 1) with the SmolLM2-135M model, bare on the host
# vs sealed as the engine role of `sealnode run` (the client then runs sealed in the node role,
# reaching the engine on the cell's loopback). Same client, same requests, alternating ROUNDS.
# Needs scripts/build-llama-server and scripts/prepare-python (their env files are sourced).
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-2}; N=${N:-4}
LLM=${SEALNODE_LLM_DIR:-/var/tmp/sealnode-llm}; PYD=${SEALNODE_TEST_CACHE:-/var/tmp/sealnode-test}
"$REPO/scripts/build-llama-server" "$LLM" >/dev/null; . "$LLM/env"
"$REPO/scripts/prepare-python" "$PYD" >/dev/null; . "$PYD/env"
PY=$SEALNODE_TEST_VENV/bin/python
install -m 0644 "$REPO/bench/llama-client.py" "$BENCH/bin/"
ARGS="-m MODEL --host 127.0.0.1 --port PORT -t 1 -c 2048"
bare() {
  "$SEALNODE_TEST_LLAMA_SERVER" ${ARGS//MODEL/$SEALNODE_TEST_MODEL} >/dev/null 2>&1 & local s=$!
  for _ in $(seq 1 300); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18181/health 2>/dev/null | grep -q 200 && break; sleep 0.1; done
  "$PY" "$BENCH/bin/llama-client.py" http://127.0.0.1:18181 "$N"
  kill $s; wait $s 2>/dev/null || true
}
ARGS=${ARGS//PORT/18181}
sealed() {
  write_fixture "$BENCH/inference" rootful
  local d=$BENCH/inference
  ln -f "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf" 2>/dev/null || cp "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf"
  python3 - "$d/c.toml" "$(dirname "$SEALNODE_TEST_LLAMA_SERVER")" "$SEALNODE_TEST_PYTHON" "$SEALNODE_TEST_PYTHON_PREFIX" "$SEALNODE_TEST_VENV" "$N" <<'PY'
import sys
p, bindir, pycopy, prefix, venv, n = sys.argv[1:]
s = open(p).read()
engine = '["/opt/llama/llama-server", "-m", "/models/smollm2.gguf", "--host", "127.0.0.1", "--port", "18080", "-t", "1", "-c", "2048"]'
node = f'["{venv}/bin/python", "-I", "/opt/bench/llama-client.py", "http://127.0.0.1:18080", "{n}"]'
a, b = s.split('command = ["/usr/bin/true"]', 1)
b = b.replace('command = ["/usr/bin/true"]', 'command = ' + node, 1)
s = a + 'command = ' + engine + b
s = s.replace(f'ro_binds = [{{ src = "', f'ready = {{ kind = "http", path = "/health", timeout_s = 120 }}\nro_binds = [{{ src = "{bindir}", dst = "/opt/llama" }}, {{ src = "', 1)
node_binds = f'ro_binds = [{{ src = "{pycopy}", dst = "{prefix}" }}, {{ src = "{venv}" }}, {{ src = "'
i = s.index('[node]')
s = s[:i] + s[i:].replace('ro_binds = [{ src = "', node_binds, 1)
open(p, 'w').write(s)
PY
  "$SN" run --config "$d/c.toml" 2>/dev/null | head -n "$N" &
  wait $! || true
  pkill -f "sealnode run --config $d/c.toml" 2>/dev/null || true
}
summ() { python3 -c '
import json, statistics, sys
rows = [json.loads(l) for l in sys.stdin if l.startswith("{")]
print("%.1f %.1f %d" % (statistics.median(r["tokens_per_s"] for r in rows), statistics.median(r["prompt_ms"] for r in rows), len(rows)))'; }
b=""; s=""
for r in $(seq 1 "$ROUNDS"); do
  b+="$(bare)"$'\n'
  s+="$(sealed)"$'\n'
done
read -r btps bpms bn <<<"$(echo "$b" | summ)"
read -r stps spms sn <<<"$(echo "$s" | summ)"
echo "### inference: llama-server -t 1, SmolLM2-135M Q4_1, 64 tokens per request"
echo "| engine | requests | median tokens/s | median prompt time (≈ time to first token) |"
echo "|---|---:|---:|---:|"
echo "| bare | $bn | $btps | $bpms ms |"
echo "| sealed (sealnode run, engine role) | $sn | $stps | $spms ms |"
python3 -c "print('| ratio sealed/bare | | %.3f | |' % ($stps / $btps))"

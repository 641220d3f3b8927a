#!/usr/bin/env bash
# What a user of the network feels: a frutebox-node job's latency, bare vs sealed. Two full
# stacks run at once: bare (llama-server and frutebox-node on the host, unconfined) and sealed
# (the same two as the engine and node roles of `sealnode run`, the node reaching its gateway
# through declared egress and the engine through the node-to-engine hop). One benchmark gateway
# (job-gateway.py) sends both nodes the same jobs, one at a time, in alternating order: per round
# a streamed job (time to first chunk, gap between chunks, job latency) and a plain one.
# Needs scripts/build-llama-server and scripts/prepare-python (their env files are sourced).
. "$(dirname "$0")/common.sh"
ROUNDS=${ROUNDS:-12}; MAX_TOKENS=${MAX_TOKENS:-64}; GW=${GW_PORT:-18766}
LLM=${SEALNODE_LLM_DIR:-/var/tmp/sealnode-llm}; PYD=${SEALNODE_TEST_CACHE:-/var/tmp/sealnode-test}
"$REPO/scripts/build-llama-server" "$LLM" >/dev/null; . "$LLM/env"
"$REPO/scripts/prepare-python" "$PYD" >/dev/null; . "$PYD/env"
PY=$SEALNODE_TEST_VENV/bin/python
d=$BENCH/job
write_fixture "$d" rootful
ln -f "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf" 2>/dev/null || cp "$SEALNODE_TEST_MODEL" "$d/models/smollm2.gguf"
# The node's environment, the same on both sides but for the engine's address.
nodeenv() { echo "FRUTEBOX_ENGINE=llamacpp FRUTEBOX_LLAMACPP_HOST=http://127.0.0.1:$1 FRUTEBOX_LLAMACPP_MAX_TOKENS=$MAX_TOKENS FRUTEBOX_NODE_STATE_FILE=$2"; }
nodeargs() { echo "-I -u -m frutebox.provider --id $1 --gateway-url ws://$2:$GW/provider/ws --models smollm2 --compute-type cpu --memory-gb 2 --cpu-cores 1"; }
python3 - "$d/c.toml" "$(dirname "$SEALNODE_TEST_LLAMA_SERVER")" "$SEALNODE_TEST_PYTHON" "$SEALNODE_TEST_PYTHON_PREFIX" "$SEALNODE_TEST_VENV" "$GW" "$(nodeenv 18080 /scratch/state)" "$(nodeargs sealed gateway.bench)" <<'PY'
import json, sys
p, bindir, pycopy, prefix, venv, gw, env, args = sys.argv[1:]
s = open(p).read()
engine = '["/opt/llama/llama-server", "-m", "/models/smollm2.gguf", "--host", "127.0.0.1", "--port", "18080", "-t", "1", "-c", "2048"]'
node = json.dumps([f"{venv}/bin/python"] + args.split())
a, b = s.split('command = ["/usr/bin/true"]', 1)
b = b.replace('command = ["/usr/bin/true"]', 'command = ' + node, 1)
s = a + 'command = ' + engine + b
s = s.replace('ro_binds = [{ src = "', f'ready = {{ kind = "http", path = "/health", timeout_s = 120 }}\nro_binds = [{{ src = "{bindir}", dst = "/opt/llama" }}, {{ src = "', 1)
node_binds = f'ro_binds = [{{ src = "{pycopy}", dst = "{prefix}" }}, {{ src = "{venv}" }}, {{ src = "'
i = s.index('[node]')
s = s[:i] + s[i:].replace('ro_binds = [{ src = "', node_binds, 1)
sets = ", ".join(f'{k} = "{v}"' for k, v in (kv.split("=", 1) for kv in env.split()))
s += f'\negress = [{{ host = "gateway.bench", port = {gw}, connect = "127.0.0.1:{gw}" }}]\nenv = {{ set = {{ {sets} }} }}\n'
open(p, 'w').write(s)
PY
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; pkill -f "sealnode run --config $d/c.toml" 2>/dev/null || true' EXIT
"$PY" -u "$REPO/bench/job-gateway.py" --port "$GW" --rounds "$ROUNDS" > "$d/jobs.jsonl" & gw=$!
"$SEALNODE_TEST_LLAMA_SERVER" -m "$SEALNODE_TEST_MODEL" --host 127.0.0.1 --port 18181 -t 1 -c 2048 >/dev/null 2>&1 & pids+=($!)
for _ in $(seq 1 300); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:18181/health 2>/dev/null | grep -q 200 && break; sleep 0.1; done
mkdir -p "$d/bare"
# shellcheck disable=SC2046
env -i HOME="$d/bare" PATH=/usr/bin:/bin $(nodeenv 18181 "$d/bare/state") "$PY" $(nodeargs bare 127.0.0.1) >/dev/null 2>&1 & pids+=($!)
"$SN" run --config "$d/c.toml" >/dev/null 2>&1 & pids+=($!)
wait "$gw"
"$PY" - "$d/jobs.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = lambda n, s: [r for r in rows if r["node"] == n and r["stream"] == s]
med = lambda xs: statistics.median(xs)
same = all(a["content"] == b["content"] for a in rows for b in rows if a["job"].split("-", 1)[1] == b["job"].split("-", 1)[1])
print("### job: frutebox-node + llama-server -t 1, SmolLM2-135M Q4_1, bare vs sealed, interleaved")
print("| job | metric | bare | sealed | speed sealed/bare (bare ÷ sealed) | median per-round ratio |")
print("|---|---|---:|---:|---:|---:|")
for stream, metrics in ((True, ("latency_ms", "first_chunk_ms", "chunk_gap_ms")), (False, ("latency_ms",))):
    for m in metrics:
        b, s = med([r[m] for r in by("bare", stream)]), med([r[m] for r in by("sealed", stream)])
        # Each round's two jobs carry the same prompt, close together in time.
        pair = {r["round"]: r[m] for r in by("bare", stream)}
        pr = med([pair[r["round"]] / r[m] for r in by("sealed", stream)])
        print(f"| {'streamed' if stream else 'plain'} | median {m} ({len(by('bare', stream))} jobs each) | {b:.1f} | {s:.1f} | {b / s:.3f} | {pr:.3f} |")
toks = sorted({r["tokens"] for r in rows})
print(f"\ntokens per job: {toks}; bare and sealed answers identical: {'yes' if same else 'NO'}")
PY

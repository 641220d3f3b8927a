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
llm_env
PY=$SEALNODE_TEST_VENV/bin/python
d=$BENCH/job
# The node's environment, the same on both sides but for the engine's address.
nodeenv() { echo "FRUTEBOX_ENGINE=llamacpp FRUTEBOX_LLAMACPP_HOST=http://127.0.0.1:$1 FRUTEBOX_LLAMACPP_MAX_TOKENS=$MAX_TOKENS FRUTEBOX_NODE_STATE_FILE=$2"; }
nodeargs() { echo "-I -u -m frutebox.provider --id $1 --gateway-url ws://$2:$GW/provider/ws --models smollm2 --compute-type cpu --memory-gb 2 --cpu-cores 1"; }
sets=$(for kv in $(nodeenv 18080 /scratch/state); do printf '%s = "%s", ' "${kv%%=*}" "${kv#*=}"; done)
write_llama_fixture "$d" \
  "$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$PY" $(nodeargs sealed gateway.bench))" \
  "egress = [{ host = \"gateway.bench\", port = $GW, connect = \"127.0.0.1:$GW\" }]
env = { set = { ${sets%, } } }"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; pkill -f "sealnode run --config $d/c.toml" 2>/dev/null || true' EXIT
"$PY" -u "$REPO/bench/job-gateway.py" --port "$GW" --rounds "$ROUNDS" > "$d/jobs.jsonl" & gw=$!
start_bare_llama; pids+=("$bare_pid")
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

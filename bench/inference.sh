#!/usr/bin/env bash
# Inference under the sandbox: llama-server (-t 1) with the SmolLM2-135M model, bare on the host
# and sealed as the engine role of `sealnode run`, both up at once. One client, sealed in the node
# role, sends each round one request to each (order alternating): the sealed engine through the
# node-to-engine hop, the bare one through a declared egress. The numbers are llama-server's own
# timings, so neither hop is in them; interleaving keeps the machine's drift out of the ratio.
# Needs scripts/build-llama-server and scripts/prepare-python (their env files are sourced).
. "$(dirname "$0")/common.sh"
N=${N:-24}
llm_env
install -m 0644 "$REPO/bench/llama-client.py" "$BENCH/bin/"
d=$BENCH/inference
write_llama_fixture "$d" \
  "[\"$SEALNODE_TEST_VENV/bin/python\", \"-I\", \"/opt/bench/llama-client.py\", \"$N\", \"bare=http://bare.bench:18181\", \"sealed=http://127.0.0.1:18080\"]" \
  'egress = [{ host = "bare.bench", port = 18181, connect = "127.0.0.1:18181" }]'
start_bare_llama
trap 'kill $bare_pid 2>/dev/null || true' EXIT
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

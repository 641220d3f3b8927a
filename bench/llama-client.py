"""Inference benchmark client (stdlib only): N completions against a llama-server, printing
one JSON line per request with llama-server's own timings (tokens/s while generating, prompt
processing time ~ time to first token) and the client-side wall time.

    python3 llama-client.py http://127.0.0.1:8080 N [N_PREDICT]
"""
import json
import sys
import time
import urllib.request

base, n = sys.argv[1], int(sys.argv[2])
n_predict = int(sys.argv[3]) if len(sys.argv) > 3 else 64
prompt = "Explain in a few sentences why a sandbox should use more than one independent layer of defence."
for i in range(n):
    body = json.dumps({"prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(base + "/completion", data=body, headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    r = json.loads(urllib.request.urlopen(req, timeout=300).read())
    wall = time.perf_counter() - t
    tm = r["timings"]
    print(json.dumps({"tokens_per_s": tm["predicted_per_second"], "prompt_ms": tm["prompt_ms"], "predicted": tm["predicted_n"], "wall_s": wall}), flush=True)

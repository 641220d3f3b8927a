"""Inference benchmark client (stdlib only): N rounds of completions against one or more
llama-servers, printing one JSON line per request with llama-server's own timings (tokens/s
while generating, prompt processing time ~ time to first token) and the client-side wall time.

    python3 llama-client.py N LABEL=URL [LABEL=URL ...] [--n-predict K]

With several servers, every round sends one request to each, the order reversed every other
round (A B, B A, ...), so slow drifts of a shared machine fall on all of them alike.
"""
import json
import sys
import time
import urllib.request

args = sys.argv[1:]
n_predict = 64
if "--n-predict" in args:
    i = args.index("--n-predict")
    n_predict = int(args[i + 1])
    del args[i:i + 2]
n = int(args[0])
servers = [a.split("=", 1) for a in args[1:]]
prompt = "Explain in a few sentences why a sandbox should use more than one independent layer of defence."
body = json.dumps({"prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "temperature": 0, "ignore_eos": True}).encode()
for i in range(n):
    for label, base in (servers if i % 2 == 0 else servers[::-1]):
        req = urllib.request.Request(base + "/completion", data=body, headers={"Content-Type": "application/json"})
        t = time.perf_counter()
        r = json.loads(urllib.request.urlopen(req, timeout=300).read())
        wall = time.perf_counter() - t
        tm = r["timings"]
        print(json.dumps({"engine": label, "round": i, "tokens_per_s": tm["predicted_per_second"], "prompt_ms": tm["prompt_ms"], "predicted": tm["predicted_n"], "wall_s": wall}), flush=True)

"""The soak's report (bench/soak.sh): jobs sent, answered and failed, in total and per fault kind,
and every failure's text, from the gateway's log (jobs.jsonl) and the fault log (faults.jsonl).

A fault's window runs from the fault until the cell was ready again (for the kinds that restart
the node: also until the node registered with the gateway again), plus GRACE seconds. A job
counts for a fault when it was in flight at some time in its window (sent before the window
ends, its outcome after the fault); a job in two windows counts for the later fault.

    python soak-report.py DIR GRACE "config line"
"""
import collections
import json
import os
import re
import statistics
import sys

d, grace, config = sys.argv[1], float(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(os.path.join(d, "jobs.jsonl")) if l.strip()]
faults = [json.loads(l) for l in open(os.path.join(d, "faults.jsonl")) if l.strip()]
start = next(r for r in rows if r["ev"] == "start")
end = next((r for r in rows if r["ev"] == "end"), None)
jobs = [r for r in rows if r["ev"] == "job"]
regs = [r["t"] for r in rows if r["ev"] == "conn" and r["what"] == "registered"]
closes = [r for r in rows if r["ev"] == "conn" and r["what"] == "closed"]
unsent = [r for r in rows if r["ev"] == "unsent"]
t0 = start["t"]
KINDS = ["engine-kill", "reload", "recycle", "engine-stop", "rollout-in-place", "rollout-node", "node-kill"]
NODE_RESTARTS = {"node-kill", "reload", "recycle", "rollout-node"}
TARGET = {"engine-kill", "reload", "recycle", "engine-stop", "rollout-in-place", "rollout-node"}
NAMES = {"engine-kill": "engine killed (SIGKILL of llama-server)", "node-kill": "node killed (SIGKILL of frutebox-node)",
         "reload": "reload (SIGHUP to sealnode)", "recycle": "recycle (`sealnode ctl recycle`)",
         "engine-stop": "engine stopped 3 s (SIGSTOP, SIGCONT)",
         "rollout-in-place": "rollout, applied in place (a forwarder bound changed, SIGHUP)",
         "rollout-node": "rollout, the node alone (a node setting changed, SIGHUP)"}

for f in faults:
    ready = f["ready_t"] if f["ready_t"] is not None else f["t"] + 180
    if f["kind"] in NODE_RESTARTS:
        ready = max([ready] + [t for t in regs if t > f["t"]][:1])
    f["back_t"] = ready
    f["end_t"] = ready + grace
    f["jobs"] = []

outside = []
for j in jobs:
    hit = [f for f in faults if j["sent"] <= f["end_t"] and j["t"] >= f["t"]]
    (hit[-1]["jobs"] if hit else outside).append(j)

med = lambda xs: statistics.median(xs) if xs else float("nan")
print(f"### soak: {(end or jobs[-1])['t'] - t0:.0f} s, {len(faults)} faults, frutebox-node + llama-server -t 1 (SmolLM2-135M Q4_1), sealed")
print(f"\n{config}; a fault's window: until ready again + {grace:.0f} s.\n")
print("| fault kind | faults | back in (median, max) | jobs in its windows | answered | failed | failed, sent before the fault | failed, sent after |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for k in KINDS + ["none"]:
    fs = [f for f in faults if f["kind"] == k]
    js = [j for f in fs for j in f["jobs"]] if k != "none" else outside
    if k != "none" and not fs:
        continue
    bad = [j for j in js if not j["ok"]]
    before = [j for j in bad if k != "none" and j["sent"] < next(f["t"] for f in fs if j in f["jobs"])]
    back = [f["back_t"] - f["t"] for f in fs]
    name = NAMES.get(k, "outside any fault's window")
    target = " (target: 0 failed)" if k in TARGET else ""
    print(f"| {name}{target} | {len(fs) if fs else '-'} | "
          f"{f'{med(back):.1f} s, {max(back):.1f} s' if back else '-'} | {len(js)} | {len(js) - len(bad)} | {len(bad)} | "
          f"{len(before) if k != 'none' else '-'} | {len(bad) - len(before) if k != 'none' else '-'} |")
bad = [j for j in jobs if not j["ok"]]
print(f"| **all** | {len(faults)} | | {len(jobs)} | {len(jobs) - len(bad)} | {len(bad)} | | |")
lat = [j["latency_ms"] for j in jobs if j["ok"]]
print(f"\njobs sent {len(jobs)}, answered {len(jobs) - len(bad)}, failed {len(bad)}; "
      f"median latency of the answered {med(lat):.0f} ms; the node's WebSocket registered {len(regs)} times; "
      f"{len(unsent)} sends refused by a closing WebSocket (never sent, not counted)")
if end is None:
    print("\n**the gateway did not finish** (no end event)")

print("\n#### failures by fault kind and text\n")
if not bad:
    print("none")
else:
    kind_of = {j["job"]: f["kind"] for f in faults for j in f["jobs"]}
    # The connection's number aside, so that one cause reads as one line.
    count = collections.Counter((kind_of.get(j["job"], "none"), re.sub(r"connection \d+", "connection N", j["error"]))
                                for j in bad)
    print("| fault kind | failed | text |")
    print("|---|---:|---|")
    for (k, e), n in sorted(count.items()):
        print(f"| {k} | {n} | {e} |")

print("\n#### faults\n")
print("| # | kind | at | back after | jobs | failed | detail |")
print("|---:|---|---:|---:|---:|---:|---|")
for f in faults:
    nb = sum(not j["ok"] for j in f["jobs"])
    print(f"| {f['fault']} | {f['kind']} | +{f['t'] - t0:.1f} s | {f['back_t'] - f['t']:.1f} s | {len(f['jobs'])} | {nb} | "
          f"{'late: the cell was not ready at its time; ' if f['late'] else ''}{f['detail']} |")

# The node prints what an error frame leaves out: "[sealed] job ID failed: TYPE: text".
log = open(os.path.join(d, "sealnode.log"), errors="replace").read()
said = dict(re.findall(r"\] job (\S+) failed: (.*)", log))
why = lambda j: j["error"] + (f" (node: {said[j['job']]})" if j["job"] in said else "")
for f in faults:
    fb = [j for j in f["jobs"] if not j["ok"]]
    if fb:
        print(f"\nfault {f['fault']} ({f['kind']}, +{f['t'] - t0:.1f} s): " + "; ".join(
            f"{j['job']} sent {j['sent'] - f['t']:+.2f} s, failed {j['t'] - f['t']:+.2f} s: {why(j)}" for j in fb))
if outside and any(not j["ok"] for j in outside):
    print("\noutside any window: " + "; ".join(f"{j['job']} at +{j['t'] - t0:.1f} s: {why(j)}" for j in outside if not j["ok"]))

try:
    s = json.load(open(os.path.join(d, "status-end.json")))
    ef = s.get("engine_forwarding") or {}
    print(f"\nsealnode at the end: engine_forwarding accepted {ef.get('accepted')}, held {ef.get('held')}, "
          f"hold_expired {ef.get('hold_expired')}, replayed {ef.get('replayed')}, connect_failed {ef.get('connect_failed')}; restarts "
          + ", ".join(f"{r['role']} {r['restarts']}" for r in s["roles"]))
except (OSError, ValueError, KeyError):
    print("\n(no final status)")
marks = ["draining", "drain timed out", "the engine was not ready in time", "grace period over; SIGKILL",
         "SIGHUP ignored", "reload refused", "role exited"]
print("sealnode.log: " + ", ".join(f"`{m}` {log.count(m)}" for m in marks))

#!/usr/bin/env python3
"""Aggregate hyperfine JSON exports from several alternating rounds into one markdown table:
median, min, max of every run of each command, and the ratio of medians to the anchor.

    report.py ANCHOR_NAME round1.json round2.json ...
"""
import json
import statistics
import sys

anchor, files = sys.argv[1], sys.argv[2:]
times = {}
order = []
for f in files:
    for r in json.load(open(f))["results"]:
        name = r["command"]
        if name not in times:
            order.append(name)
        times.setdefault(name, []).extend(r["times"])
base = statistics.median(times[anchor]) if anchor in times else None
print("| command | runs | median | min | max | vs " + anchor + " |")
print("|---|---:|---:|---:|---:|---:|")
for name in order:
    t = [x * 1000 for x in times[name]]
    med = statistics.median(t)
    ratio = f"{med / (base * 1000):.2f}x" if base else "-"
    print(f"| {name} | {len(t)} | {med:.2f} ms | {min(t):.2f} ms | {max(t):.2f} ms | {ratio} |")

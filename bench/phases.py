#!/usr/bin/env python3
"""The phases of each launch in a `perf script` of sched tracepoints (launch-phases.sh), as one
markdown table with a column per candidate: medians over the launches found.

    phases.py SEALNODE_PATH NAME=perf-script.txt ...

A launch starts at the exec of the launcher (sealnode or bwrap, after `setpriv` where run
rootless) and ends at that process's exit. In it, the first fork is the sandbox's clone, the
second the workload's fork (sealnode's init, bwrap's pid 1), then the workload's exec of
/bin/true.
"""
import re
import statistics
import sys

LINE = re.compile(r"\s*(\S+)\s+(\d+)\s+([\d.]+):\s+(\S+):\s*(.*)")
PHASES = [
    ("exec of the launcher -> clone of the sandbox", "start", "clone"),
    ("clone -> fork of the workload (the sandbox's setup)", "clone", "fork"),
    ("fork -> exec of the workload (its confinement)", "fork", "exec"),
    ("exec of the workload -> the launcher's exit", "exec", "end"),
    ("whole launch", "start", "end"),
]


def launches(path, launcher):
    out, cur = [], None
    for line in open(path):
        m = LINE.match(line)
        if not m:
            continue
        _, pid, t, ev, rest = m.groups()
        pid, t = int(pid), float(t) * 1000
        if ev == "sched:sched_process_exec":
            name = rest.split("filename=")[1].split()[0]
            if name == launcher:
                cur = {"pid": pid, "start": t, "forks": []}
            elif cur and name == "/bin/true" and "exec" not in cur:
                cur["exec"] = t
        elif cur and ev == "sched:sched_process_fork":
            cur["forks"].append(t)
        elif cur and ev == "sched:sched_process_exit" and pid == cur["pid"]:
            if len(cur["forks"]) >= 2 and "exec" in cur:
                cur["clone"], cur["fork"] = cur["forks"][0], cur["forks"][1]
                cur["end"] = t
                out.append(cur)
            cur = None
    return out


def main():
    sn, runs = sys.argv[1], [a.split("=", 1) for a in sys.argv[2:]]
    found = {}
    for name, path in runs:
        launcher = sn if name == "sealnode" else "/usr/bin/bwrap"
        found[name] = launches(path, launcher)
    names = [n for n, _ in runs]
    print("| phase | " + " | ".join(f"{n} ({len(found[n])} launches)" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for label, a, b in PHASES:
        cells = []
        for n in names:
            d = [x[b] - x[a] for x in found[n]]
            cells.append(f"{statistics.median(d):.2f} ms" if d else "-")
        print(f"| {label} | " + " | ".join(cells) + " |")


main()

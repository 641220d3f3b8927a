#!/usr/bin/python3
"""Compile one of sealnode's seccomp policies (seccompiler JSON) with libseccomp instead, and
write the raw BPF program: the anchor for the launch and per-syscall benchmarks (bwrap --seccomp
takes raw BPF). Same rules, same default action (ENOSYS), libseccomp's binary-tree layout.

    /usr/bin/python3 bench/libseccomp-filter.py seccomp/node.json node out.bpf

Needs Debian's python3-seccomp (libseccomp's Python binding; /usr/bin/python3, not a venv).
"""
import json
import sys

import seccomp

OPS = {"eq": seccomp.EQ, "ne": seccomp.NE, "lt": seccomp.LT, "le": seccomp.LE, "gt": seccomp.GT, "ge": seccomp.GE}


def main():
    path, name, out = sys.argv[1:4]
    spec = json.load(open(path))[name]
    errno = spec["mismatch_action"]["errno"]
    f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(errno))
    f.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)  # binary tree over syscall numbers
    for rule in spec["filter"]:
        try:
            seccomp.resolve_syscall(seccomp.Arch.NATIVE, rule["syscall"])
        except Exception:
            continue  # not on this architecture
        conds = rule.get("args", [])
        if len(conds) > 1 and all(c["op"] == "ne" and c["index"] == conds[0]["index"] for c in conds):
            # "arg != A and arg != B" (the ioctl rule): libseccomp allows one comparison per
            # argument, so refuse A and B explicitly (low 32 bits, like the dword rule) and
            # allow the rest.
            for c in conds:
                # EPERM: libseccomp refuses a rule whose action equals the default (ENOSYS).
                f.add_rule(seccomp.ERRNO(1), rule["syscall"], seccomp.Arg(c["index"], seccomp.MASKED_EQ, 0xFFFFFFFF, c["val"]))
            f.add_rule(seccomp.ALLOW, rule["syscall"])
            continue
        args = []
        for c in conds:
            op, val = c["op"], c["val"]
            if isinstance(op, dict):  # {"masked_eq": mask}
                args.append(seccomp.Arg(c["index"], seccomp.MASKED_EQ, op["masked_eq"], val))
            else:
                args.append(seccomp.Arg(c["index"], OPS[op], val))
        f.add_rule(seccomp.ALLOW, rule["syscall"], *args)
    with open(out, "wb") as fh:
        f.export_bpf(fh)


if __name__ == "__main__":
    main()

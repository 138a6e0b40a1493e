#!/usr/bin/env python3
"""Emulated df for the gpuops sandbox host (stdlib only), installed as bin/.df-emulated: bin/df (host.DF) runs it
only when a disk fault is set, else the machine's own df.

It runs the machine's own df with the same arguments and prints its answer, except that a disk fault of the host
(`gpuops sandbox up --fault disk-full|inodes-full|disk-low=PCT`, in $GPUOPS_SANDBOX_DIR/gpu.json) rewrites the
numbers of every row as df would show that disk: full (no block free, Use% 100%), out of inodes (`df -i`: IFree 0,
IUse% 100%), or PCT % used. The job sees the same through its writes only where it writes to /dev/full (ENOSPC):
a real full filesystem needs privileges the sandbox does not have.
"""
import json
import os
import subprocess
import sys


def disk_faults():
    d = os.environ.get("GPUOPS_SANDBOX_DIR")
    out = {}
    if not d:
        return out
    try:
        with open(os.path.join(d, "gpu.json")) as fh:
            faults = json.load(fh).get("faults") or []
    except (OSError, ValueError):
        return out
    for text in faults:
        name, _, value = text.partition("@")[0].partition("=")
        if name in ("disk-full", "inodes-full", "disk-low"):
            out[name] = value or None
    return out


def real_df():
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    for p in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/bin"]:
        cand = os.path.join(p, "df")
        if p and os.path.abspath(p) != here and os.access(cand, os.X_OK):
            return cand
    return "/bin/df"


def rewrite(line, used_pct):
    """A data row with Used/Avail/Use% set for used_pct % of its size (the other columns kept)."""
    parts = line.split()
    if len(parts) < 6 or not parts[1].isdigit() or not parts[2].isdigit() or not parts[3].isdigit():
        return line
    size = int(parts[1])
    used = size if used_pct >= 100 else size * used_pct // 100
    parts[2], parts[3], parts[4] = str(used), str(size - used), "%d%%" % used_pct if size else "-"
    return " ".join(parts)


def main(argv):
    res = subprocess.run([real_df()] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    faults = disk_faults()
    inodes = any(a in ("-i", "--inodes") or (a.startswith("-") and not a.startswith("--") and "i" in a[1:])
                 for a in argv)
    pct = None
    if inodes and "inodes-full" in faults:
        pct = 100
    elif not inodes and "disk-full" in faults:
        pct = 100
    elif not inodes and "disk-low" in faults:
        pct = int(faults["disk-low"] or 97)
    lines = res.stdout.splitlines()
    if pct is not None and lines:
        lines = lines[:1] + [rewrite(x, pct) for x in lines[1:]]
    sys.stdout.write("".join(x + "\n" for x in lines))
    sys.stderr.write(res.stderr)
    return res.returncode


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(0)

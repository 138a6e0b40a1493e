#!/usr/bin/env python3
"""Emulated kernel log for the gpuops sandbox host (stdlib only), installed as bin/dmesg and bin/journalctl.

It prints the NVIDIA driver's boot lines as the real H100 SXM5 host did (../shared/reference/nvidia-smi-h100-sxm5/
health-fields.txt), plus the Xid line of an injected `xid` fault (at the moment the fault was injected: gpu.json's
time) and the kernel's own events (kernel.jsonl: the emulated OOM killer's lines), in each tool's own format:
  dmesg                               [    1.251064] NVRM: ...              (seconds since this machine's boot)
  journalctl -k -b                    Nov 23 03:25:52 sandbox kernel: NVRM: ...
  journalctl -k -b -o short-unix      1700000000.123456 sandbox kernel: NVRM: ...
The `kernel-log-unreadable` fault answers as an unprivileged user is answered: dmesg fails with
"dmesg: read kernel buffer failed: Operation not permitted" (exit 1); journalctl shows no kernel entries (exit 0).
State: $GPUOPS_SANDBOX_DIR/gpu.json (faults, driver, GPU model), $GPUOPS_SANDBOX_DIR/kernel.jsonl (events:
{"at": epoch, "message": text}, appended by record()).
"""
import json
import os
import sys
import time

# NVIDIA's wording for the codes the sandbox can inject (Xid catalog, docs.nvidia.com/deploy/xid-errors);
# other codes get a generic text.
XID_TEXT = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address",
    31: "ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f12_34560000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    43: "Ch 00000010",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
        "subpartition 0.",
    63: "Row Remapper: New row marked for remapping, reset gpu to activate.",
    64: "Row Remapper: Failed to mark row for remapping.",
    74: "NVLink: fatal error detected on link 3(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    119: "Timeout after 6s of waiting for RPC response from GPU0 GSP! Expected function 76 (GSP_RM_CONTROL).",
}


def load_state():
    state = {"driver": "570.148.08", "faults": [], "gpu": "h100-pcie"}
    d = os.environ.get("GPUOPS_SANDBOX_DIR")
    if d:
        try:
            with open(os.path.join(d, "gpu.json")) as fh:
                state.update(json.load(fh))
        except (OSError, ValueError):
            pass
    return state


def faults(state):
    out = {}
    for text in state.get("faults") or []:
        text, _, gpu = text.partition("@")
        name, _, value = text.partition("=")
        out[name] = (value or None, int(gpu) if gpu.isdigit() else 0)
    return out


def bus_of(state, idx):
    """PCI:0000:18:00 for the idx-th emulated GPU (the same bus ids nvidia-smi reports)."""
    bus = "00000000:08:00.0"
    here = os.path.dirname(os.path.abspath(sys.argv[0]))
    for path in (os.path.join(here, "nvidia-smi"), os.path.join(here, "nvidia_smi.py")):  # installed / in the package
        try:
            from importlib.machinery import SourceFileLoader
            bus = SourceFileLoader("nvidia_smi", path).load_module().CATALOG[state.get("gpu")]["bus"]
            break
        except Exception:
            continue
    dev = int(bus[-7:-5], 16) + idx
    return "%s:%02x:%s" % (bus[4:8], dev, bus[-4:-2])


def boot_time():
    """This machine's boot on the wall clock (the emulated kernel's uptime is the machine's): /proc/stat's btime, the
    same at every call (a line's time since boot never moves, as in a real kernel log)."""
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return float(int(time.time() - 6000))


def record(sandbox_dir, message, at=None):
    """Append a kernel event (what the emulated kernel says, e.g. its OOM killer) to <sandbox_dir>/kernel.jsonl."""
    line = json.dumps({"at": time.time() if at is None else at, "message": message})
    with open(os.path.join(str(sandbox_dir), "kernel.jsonl"), "a") as fh:
        fh.write(line + "\n")


def oom_lines(pid, name, uid, anon_kb, cgroup="/user.slice/user-%d.slice/session-1.scope"):
    """The two lines Linux's OOM killer prints for a kill (mm/oom_kill.c: dump_oom_summary, __oom_kill_process)."""
    cg = cgroup % uid if "%d" in cgroup else cgroup
    return ["oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=%s,"
            "task=%s,pid=%d,uid=%d" % (cg, name, pid, uid),
            "Out of memory: Killed process %d (%s) total-vm:%dkB, anon-rss:%dkB, file-rss:0kB, shmem-rss:0kB, "
            "UID:%d pgtables:%dkB oom_score_adj:0" % (pid, name, anon_kb + 1048576, anon_kb, uid, anon_kb // 500)]


def events(state_dir):
    """The kernel's own events: [(epoch, message)]."""
    out = []
    try:
        with open(os.path.join(state_dir, "kernel.jsonl")) as fh:
            for line in fh:
                try:
                    doc = json.loads(line)
                    out.append((float(doc["at"]), str(doc["message"])))
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out


def fault_time(state_dir):
    """When the host's faults were last set (gpu.json written): the moment an injected Xid happened."""
    try:
        return os.stat(os.path.join(state_dir, "gpu.json")).st_mtime
    except OSError:
        return None


def messages(state):
    drv = state.get("driver", "570.148.08")
    msgs = [(0.0, "Linux version 6.8.0-60-generic (buildd@lcy02-amd64-080) (gcc 13.3.0) #63-Ubuntu SMP"),
            (0.611032, "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  (dvs-builder@U22-I3-B16-02-4)  " % drv),
            (3.420580, "NVRM: Persistence mode is deprecated and will be removed in a future release. "
                       "Please use nvidia-persistenced instead.")]
    f = faults(state)
    d = os.environ.get("GPUOPS_SANDBOX_DIR")
    boot = boot_time()
    if "xid" in f:
        value, idx = f["xid"]
        code = int(value) if value and value.isdigit() else 79
        at = fault_time(d) if d else None
        msgs.append((max(0.0, at - boot) if at else 5231.774012, "NVRM: Xid (PCI:%s): %d, pid=48213, name=python3, %s"
                     % (bus_of(state, idx), code, XID_TEXT.get(code, "see the NVIDIA Xid catalog"))))
    if d:
        msgs += [(max(0.0, at - boot), m) for at, m in events(d)]
    msgs.sort(key=lambda x: x[0])
    return msgs, "kernel-log-unreadable" in f


def main(argv):
    state = load_state()
    msgs, unreadable = messages(state)
    tool = os.path.basename(sys.argv[0])
    if tool == "journalctl":
        if unreadable:
            sys.stderr.write("Hint: You are currently not seeing messages from other users and the system.\n"
                             "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
                             "      Pass -q to turn off this notice.\n")
            if "-q" not in argv and "--quiet" not in argv:
                sys.stdout.write("-- No entries --\n")
            return 0
        boot = boot_time()
        unix = any(a == "short-unix" or a == "--output=short-unix" for a in argv) or (
            "-o" in argv and argv[argv.index("-o") + 1:argv.index("-o") + 2] == ["short-unix"])
        for t, m in msgs:
            when = ("%.6f" % (boot + t)) if unix else time.strftime("%b %d %H:%M:%S", time.localtime(boot + t))
            sys.stdout.write("%s sandbox kernel: %s\n" % (when, m))
        return 0
    if unreadable:
        sys.stderr.write("dmesg: read kernel buffer failed: Operation not permitted\n")
        return 1
    for t, m in msgs:
        sys.stdout.write("[%12.6f] %s\n" % (t, m))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(0)

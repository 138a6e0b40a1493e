#!/usr/bin/env python3
"""Emulated nvidia-smi for the gpuops sandbox host (stdlib only).

It answers the forms gpuops uses, in nvidia-smi's own formats, exit codes and failure messages:
  nvidia-smi                                  the summary table (legacy or R610+ "KMD Version" header)
  nvidia-smi -L                               the GPU list
  nvidia-smi --version
  nvidia-smi --query-gpu=F,... --format=csv[,noheader][,nounits] [-l N | -lms N]
  nvidia-smi --query-compute-apps=F,... --format=csv[,noheader][,nounits]
State comes from $GPUOPS_SANDBOX_DIR/gpu.json (written by `gpuops sandbox up`). It says it is emulated:
in the table, in -L, and in every UUID ("GPU-e3e3e3e3-...": e3 for emulated).
A process whose environment holds GPUOPS_RUN_ID (and this host's GPUOPS_SANDBOX_DIR) counts as a GPU process
and drives utilisation.
"""
import json
import os
import sys
import time

CATALOG = {
    "h100-pcie": {"name": "NVIDIA H100 PCIe", "memory": 81559, "cc": "9.0", "power_limit": 350.0, "bus": "00000000:08:00.0"},
    "h100-sxm": {"name": "NVIDIA H100 80GB HBM3", "memory": 81559, "cc": "9.0", "power_limit": 700.0, "bus": "00000000:18:00.0"},
    "a100": {"name": "NVIDIA A100-SXM4-80GB", "memory": 81920, "cc": "8.0", "power_limit": 400.0, "bus": "00000000:07:00.0"},
    "rtx6000ada": {"name": "NVIDIA RTX 6000 Ada Generation", "memory": 49140, "cc": "8.9", "power_limit": 300.0, "bus": "00000000:01:00.0"},
}

FAILURES = {
    "driver-not-loaded": (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                             "Make sure that the latest NVIDIA driver is installed and running.\n"),
    "version-mismatch": (18, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 570.172\n"),
    "no-devices": (6, "No devices were found\n"),
    "gpu-lost": (15, "Unable to determine the device handle for GPU0000:08:00.0: GPU is lost.  "
                     "Reboot the system to recover this GPU\n"),
}

GPU_FIELDS = [
    "timestamp", "count", "index", "name", "uuid", "serial", "pci.bus_id", "driver_version", "compute_cap",
    "memory.total", "memory.used", "memory.free", "memory.reserved", "utilization.gpu", "utilization.memory",
    "temperature.gpu", "temperature.memory", "power.draw", "power.limit", "power.max_limit", "fan.speed",
    "pstate", "clocks.sm", "clocks.max.sm", "persistence_mode", "ecc.errors.uncorrected.volatile.total",
    "vbios_version", "name", "gpu_name", "gpu_uuid", "gpu_bus_id",
]
UNITS = {"memory.total": " MiB", "memory.used": " MiB", "memory.free": " MiB", "memory.reserved": " MiB",
         "utilization.gpu": " %", "utilization.memory": " %", "power.draw": " W", "power.limit": " W",
         "power.max_limit": " W", "fan.speed": " %", "clocks.sm": " MHz", "clocks.max.sm": " MHz"}
HEADERS = {"memory.total": "memory.total [MiB]", "memory.used": "memory.used [MiB]", "memory.free": "memory.free [MiB]",
           "utilization.gpu": "utilization.gpu [%]", "utilization.memory": "utilization.memory [%]",
           "power.draw": "power.draw [W]", "power.limit": "power.limit [W]", "fan.speed": "fan.speed [%]"}
APP_FIELDS = ["pid", "process_name", "used_memory", "used_gpu_memory", "gpu_uuid", "gpu_bus_id", "gpu_name"]


def load_state():
    d = os.environ.get("GPUOPS_SANDBOX_DIR")
    state = {"gpu": "h100-pcie", "count": 1, "driver": "570.148.08", "cuda": "12.8", "fail": None,
             "header": "legacy", "na_fields": [], "unsupported_fields": []}
    if d:
        try:
            with open(os.path.join(d, "gpu.json")) as fh:
                state.update(json.load(fh))
        except (OSError, ValueError):
            pass
    return state


def gpu_processes():
    """Processes of this user that carry GPUOPS_RUN_ID: a gpuops job 'on the GPU'."""
    procs = []
    here = os.environ.get("GPUOPS_SANDBOX_DIR")
    mine = ("GPUOPS_SANDBOX_DIR=" + here).encode() if here else None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as fh:
                env = fh.read().split(b"\0")
            with open("/proc/%s/comm" % pid) as fh:
                comm = fh.read().strip()
        except OSError:
            continue
        if comm in ("bash", "sh", "dash", "nohup", "setsid", "sleep", "tail", "timeout"):
            continue
        run = [e for e in env if e.startswith(b"GPUOPS_RUN_ID=")]
        if not run or (mine and mine not in env):
            continue  # not a gpuops job, or a job of another sandbox host on this machine
        vis = [e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"CUDA_VISIBLE_DEVICES=")]
        gpu = int(vis[0].split(",")[0]) if vis and vis[0].split(",")[0].isdigit() else 0
        procs.append({"pid": int(pid), "name": comm, "gpu": gpu})
    return procs


def gpus(state, procs):
    spec = CATALOG.get(state["gpu"], CATALOG["h100-pcie"])
    out = []
    for i in range(int(state["count"])):
        mine = [p for p in procs if p["gpu"] == i]
        busy = bool(mine)
        wobble = int(time.time()) % 7
        used = (spec["memory"] * 6 // 10 + 13 * wobble) if busy else 1
        bus = spec["bus"][:-7] + "%02X" % (int(spec["bus"][-7:-5], 16) + i) + spec["bus"][-5:]
        out.append({
            "index": i, "name": spec["name"], "uuid": "GPU-e3e3e3e3-%04d-4000-8000-%012d" % (i, i),
            "serial": "EMULATED%05d" % i, "pci.bus_id": bus, "driver_version": state["driver"],
            "compute_cap": spec["cc"], "memory.total": spec["memory"], "memory.used": used,
            "memory.free": spec["memory"] - used, "memory.reserved": 0,
            "utilization.gpu": (93 + wobble) if busy else 0, "utilization.memory": (41 + wobble) if busy else 0,
            "temperature.gpu": (61 + wobble) if busy else 31 + i, "temperature.memory": "N/A",
            "power.draw": round(spec["power_limit"] * (0.82 if busy else 0.14) + wobble, 2),
            "power.limit": spec["power_limit"], "power.max_limit": spec["power_limit"], "fan.speed": "[N/A]",
            "pstate": "P0", "clocks.sm": 1755 if busy else 345, "clocks.max.sm": 1755, "persistence_mode": "Enabled",
            "ecc.errors.uncorrected.volatile.total": 0, "vbios_version": "96.00.99.00.01",
            "procs": mine,
        })
    return out


def fmt_value(field, value, nounits, state):
    if field in state.get("unsupported_fields", []):
        return "[Not Supported]"
    if field in state.get("na_fields", []):
        return "[N/A]"
    if isinstance(value, float):
        value = "%.2f" % value
    value = str(value)
    if not nounits and field in UNITS and not value.startswith("["):
        value += UNITS[field]
    return value


def query_gpu(fields, fmt, state):
    for f in fields:
        if f not in GPU_FIELDS:
            sys.stdout.write('Field "%s" is not a valid field to query.\n\n' % f)
            return 2
    nounits = "nounits" in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join(HEADERS.get(f, f) for f in fields))
    glist = gpus(state, gpu_processes())
    for g in glist:
        row = []
        for f in fields:
            f2 = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}.get(f, f)
            if f == "timestamp":
                row.append(time.strftime("%Y/%m/%d %H:%M:%S.000"))
            elif f == "count":
                row.append(str(len(glist)))
            else:
                row.append(fmt_value(f, g[f2], nounits, state))
        lines.append(", ".join(row))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def query_apps(fields, fmt, state):
    for f in fields:
        if f not in APP_FIELDS:
            sys.stdout.write('Field "%s" is not a valid field to query.\n\n' % f)
            return 2
    nounits = "nounits" in fmt
    lines = []
    if "noheader" not in fmt:
        lines.append(", ".join("used_gpu_memory [MiB]" if f in ("used_memory", "used_gpu_memory") else f for f in fields))
    for g in gpus(state, gpu_processes()):
        for p in g["procs"]:
            vals = {"pid": p["pid"], "process_name": p["name"], "used_memory": g["memory.used"],
                    "used_gpu_memory": g["memory.used"], "gpu_uuid": g["uuid"], "gpu_bus_id": g["pci.bus_id"],
                    "gpu_name": g["name"]}
            row = []
            for f in fields:
                v = str(vals[f])
                if f in ("used_memory", "used_gpu_memory") and not nounits:
                    v += " MiB"
                row.append(v)
            lines.append(", ".join(row))
    if lines:
        sys.stdout.write("\n".join(lines) + "\n")
    return 0


def table(state):
    glist = gpus(state, gpu_processes())
    w = 91
    out = [time.strftime("%a %b %d %H:%M:%S %Y"), "+" + "-" * (w - 2) + "+"]
    if state.get("header") == "kmd":
        head = " NVIDIA-SMI %-22s KMD Version: %-14s CUDA UMD Version: %s" % (state["driver"], state["driver"], state["cuda"])
    else:
        head = " NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %s" % (state["driver"], state["driver"], state["cuda"])
    out.append("|" + head.ljust(w - 2) + "|")
    out.append("| gpuops sandbox: these GPUs are EMULATED (no real GPU on this host)".ljust(w - 1) + "|")
    out.append("+-----------------------------------------+------------------------+----------------------+")
    out.append("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |")
    out.append("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |")
    out.append("|=========================================+========================+======================|")
    for g in glist:
        out.append("| %3d  %-29s  On  | %-18s Off |                    0 |" % (g["index"], g["name"][:29], g["pci.bus_id"]))
        out.append("| N/A   %2dC    P0  %22s | %7sMiB / %6sMiB | %6s%%      Default |" % (
            g["temperature.gpu"], "%dW / %dW" % (g["power.draw"], g["power.limit"]), g["memory.used"],
            g["memory.total"], g["utilization.gpu"]))
        out.append("+-----------------------------------------+------------------------+----------------------+")
    out.append("")
    out.append("+" + "-" * (w - 2) + "+")
    out.append("| Processes:".ljust(w - 1) + "|")
    out.append("|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |")
    out.append("|=" + "=" * (w - 4) + "=|")
    procs = [(g, p) for g in glist for p in g["procs"]]
    if not procs:
        out.append("|  No running processes found".ljust(w - 1) + "|")
    for g, p in procs:
        out.append("|  %3d   N/A  N/A  %15d      C   %-32s %8sMiB |" % (g["index"], p["pid"], p["name"][:32], g["memory.used"]))
    out.append("+" + "-" * (w - 2) + "+")
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def main(argv):
    state = load_state()
    fail = state.get("fail")
    if fail == "hang":
        time.sleep(3600)
    if fail in FAILURES:
        code, msg = FAILURES[fail]
        sys.stdout.write(msg)
        return code
    if "--version" in argv:
        sys.stdout.write("NVIDIA-SMI version  : %s\nNVML version        : %s\nDRIVER version      : %s\nCUDA Version        : %s\n"
                         % (state["driver"], state["driver"].rsplit(".", 1)[0], state["driver"], state["cuda"]))
        return 0
    if "-L" in argv or "--list-gpus" in argv:
        for g in gpus(state, []):
            sys.stdout.write("GPU %d: %s (UUID: %s) [emulated by gpuops sandbox]\n" % (g["index"], g["name"], g["uuid"]))
        return 0
    opts = {}
    loop = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            opts[k] = v
        elif a in ("-l", "--loop", "-lms", "--loop-ms") and i + 1 < len(argv):
            loop = float(argv[i + 1]) / (1000.0 if "ms" in a else 1.0)
            i += 1
        elif a.startswith("--loop="):
            loop = float(a.split("=", 1)[1])
        else:
            sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
            return 2
        i += 1
    if not opts:
        return table(state)
    fmt = [x.strip() for x in opts.get("--format", "").split(",") if x.strip()]
    if "csv" not in fmt:
        sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
        return 2
    if "--query-gpu" in opts:
        fields = [f.strip() for f in opts["--query-gpu"].split(",") if f.strip()]
        fn = query_gpu
    elif "--query-compute-apps" in opts:
        fields = [f.strip() for f in opts["--query-compute-apps"].split(",") if f.strip()]
        fn = query_apps
    else:
        sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
        return 2
    while True:
        rc = fn(fields, fmt, state)
        sys.stdout.flush()
        if loop is None or rc != 0:
            return rc
        time.sleep(loop)
        state = load_state()


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (KeyboardInterrupt, BrokenPipeError):
        sys.exit(0)

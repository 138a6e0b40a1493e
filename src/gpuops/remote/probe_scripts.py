"""The child scripts the probe starts (remote/probe.py): each runs in a python process of its own, so a crash, a hang or
the seconds `import torch` takes stay out of the probe: the CUDA test, the import and find_spec checks, and the bench
of `verify --bench`. Stdlib only, Python >= 3.8, like the probe: when the probe is sent, this file goes ahead of it
in the same source (remote/gather.probe_source); run or imported locally, the probe reads this file."""

# The CUDA test and the bench import torch at once (seconds) and touch the GPUs only when their gate opens (argv[1]:
# the read end of a pipe): the CUDA test once nvidia-smi has looked at the GPUs (so neither its process nor its memory
# is in what nvidia-smi saw), the bench once everything else is done.
GATE_WAIT = r'''
def gate_wait(out):
    if len(sys.argv) < 2:
        return True
    t1 = time.time()
    try:
        go = os.read(int(sys.argv[1]), 1)
    except OSError:
        go = b""
    out["waited_seconds"] = round(time.time() - t1, 3)
    if go == b"h":
        out["driver_hung"] = True
    return go == b"g"


def not_run(out):
    if out.get("driver_hung"):
        return "not run: nvidia-smi hung, and a CUDA call on a driver that does not answer hangs too"
    return "not run: the probe ended first"
'''

CUDA_CHECK = r'''
import json, os, sys, time
out = {"imported": False}
''' + GATE_WAIT + r'''
try:
    t0 = time.time()
    import torch
    out["imported"] = True
    out["import_seconds"] = round(time.time() - t0, 3)
    if not gate_wait(out):
        print(json.dumps(dict(out, error=not_run(out))))
        sys.exit(0)
    out["version"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["file"] = getattr(torch, "__file__", None)  # which torch the job imports: the environment's or the image's
    out["prefix"], out["base_prefix"] = sys.prefix, sys.base_prefix
    out["available"] = bool(torch.cuda.is_available())
    n = torch.cuda.device_count() if out["available"] else 0
    out["device_count"] = n
    try:
        out["arch_list"] = list(torch.cuda.get_arch_list()) if out["available"] else []
    except Exception:
        out["arch_list"] = []
    out["devices"] = []
    for i in range(n):
        d = {"index": i}
        try:
            d["name"] = torch.cuda.get_device_name(i)
            d["capability"] = ".".join(str(x) for x in torch.cuda.get_device_capability(i))
            t0 = time.time()
            a = torch.randn(256, 256, device="cuda:%d" % i)
            b = (a @ a).sum().item()
            torch.cuda.synchronize(i)
            d["matmul_ok"] = b == b
            d["matmul_ms"] = round((time.time() - t0) * 1000, 1)
        except Exception as e:
            d["error"] = "%s: %s" % (type(e).__name__, e)
        out["devices"].append(d)
    try:
        out["bf16"] = bool(torch.cuda.is_bf16_supported()) if out["available"] else None
    except Exception as e:
        out["bf16"] = None
    try:
        out["cudnn"] = torch.backends.cudnn.version()
    except Exception:
        out["cudnn"] = None
    if not out["available"]:
        try:
            torch.cuda.init()
        except Exception as e:
            out["init_error"] = "%s: %s" % (type(e).__name__, e)
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
'''

IMPORT_CHECK = r'''
import json, sys, importlib
res = {}
for name in sys.argv[1:]:
    try:
        m = importlib.import_module(name)
        res[name] = {"ok": True, "version": str(getattr(m, "__version__", ""))}
    except BaseException as e:
        res[name] = {"ok": False, "error": "%s: %s" % (type(e).__name__, str(e)[:2000])}
print(json.dumps(res))
'''

# the launch gate (train): can the job's python find each module its script imports? find_spec only (no import),
# with sys.path[0] set as `python script.py` (or `python -m`) would set it, in the project folder, the job's env
FIND_CHECK = r'''
import importlib.util, json, os, sys
res = {}
for path0, names in json.loads(sys.argv[1]).items():
    sys.path[0] = os.path.abspath(path0 or ".")
    importlib.invalidate_caches()
    got = res.setdefault(path0, {})
    for name in names:
        try:
            got[name] = importlib.util.find_spec(name) is not None
        except BaseException as e:
            got[name] = "%s: %s" % (type(e).__name__, str(e)[:300])
print(json.dumps(res))
'''


# `verify --bench` (issue #15): per GPU a bf16 matmul and a device-to-device copy for ~`seconds` each, sampling
# nvidia-smi half-way through the matmul (what slows the GPU at that moment), then an all-reduce across the GPUs
# (one process per GPU, torch.distributed NCCL). The figures are judged locally (gpuops/verify/bench.py).
# device "cpu" runs the same code on CPU torch with gloo (the tests' path; no GPU on a test machine).
BENCH_CHECK = r"""
import json, os, socket, subprocess, sys, threading, time
P = json.loads(sys.argv.pop(1))
""" + GATE_WAIT + r"""
out = {"devices": [], "seconds": float(P.get("seconds", 1.0)), "device": P.get("device", "cuda"), "pid": os.getpid()}
T0 = time.time()
SAMPLE = ("index,pci.bus_id,{r}.active,{r}.hw_slowdown,{r}.hw_thermal_slowdown,{r}.sw_thermal_slowdown,"
          "{r}.hw_power_brake_slowdown,{r}.sw_power_cap,temperature.gpu,power.draw,power.limit,clocks.sm,clocks.max.sm,"
          "utilization.gpu")

def smi(args):
    r = subprocess.run(["nvidia-smi"] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=10)
    return r.returncode, r.stdout.decode("utf-8", "replace")

def sample():
    s = {"t": round(time.time() - T0, 3)}
    try:
        for r in ("clocks_event_reasons", "clocks_throttle_reasons"):
            fields = SAMPLE.format(r=r)
            rc, text = smi(["--query-gpu=" + fields, "--format=csv,noheader,nounits"])
            if rc == 0:
                s["fields"] = fields.replace("clocks_throttle_reasons", "clocks_event_reasons").split(",")
                s["gpus"] = text
                break
        rc, text = smi(["--query-compute-apps=pid,gpu_bus_id,used_memory", "--format=csv,noheader,nounits"])
        s["apps"] = text if rc == 0 else ""
    except Exception as e:
        s["error"] = "%s: %s" % (type(e).__name__, e)
    return s

def timed_loop(fn, secs, sync):
    fn(); sync()
    t0 = time.perf_counter(); it = 0
    while True:
        for _ in range(4):
            fn()
        sync(); it += 4
        el = time.perf_counter() - t0
        if el >= secs:
            return it, el

ALLREDUCE = '''
import json, sys, time, torch, torch.distributed as dist
rank, world, port, mib, dev = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if dev == "cuda":
    torch.cuda.set_device(rank)
dist.init_process_group("nccl" if dev == "cuda" else "gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                        world_size=world)
x = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device="cpu" if dev == "cpu" else "cuda:%d" % rank)
sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
for _ in range(3):
    dist.all_reduce(x)
sync()
t0 = time.perf_counter()
for _ in range(3):
    dist.all_reduce(x)
sync()
per = max((time.perf_counter() - t0) / 3, 1e-6)
# every rank must run the same number of collectives: agree on the smallest estimate for ~1 s
n = torch.tensor([max(5, min(200, int(1.0 / per)))], dtype=torch.int64, device=x.device)
dist.all_reduce(n, op=dist.ReduceOp.MIN)
iters = int(n.item())
t0 = time.perf_counter()
for _ in range(iters):
    dist.all_reduce(x)
sync()
el = (time.perf_counter() - t0) / iters
size = x.numel() * x.element_size()
if rank == 0:
    print(json.dumps({"world": world, "bytes": size, "iters": iters, "seconds_per_op": el, "backend": dist.get_backend(),
                      "algbw_gbps": size / el / 1e9, "busbw_gbps": size / el / 1e9 * 2 * (world - 1) / world}))
dist.destroy_process_group()
'''

def allreduce(n, dev, mib, timeout):
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0)); port = so.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", ALLREDUCE, str(r), str(n), str(port), str(mib), dev],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for r in range(n)]
    res = {"world": n}
    deadline = time.time() + timeout
    for r, p in enumerate(procs):
        try:
            o, e = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            return {"world": n, "error": "timed out after %ss" % timeout}
        if p.returncode != 0:
            res["error"] = "rank %d exit %s: %s" % (r, p.returncode, (e.decode("utf-8", "replace").strip().splitlines() or [""])[-1][:300])
        elif r == 0:
            res.update(json.loads(o.decode().strip().splitlines()[-1]))
    return res

try:
    import torch
    out["torch"] = torch.__version__
    dev = out["device"]
    if not gate_wait(out):
        out["error"] = not_run(out)
    elif dev == "cuda" and not torch.cuda.is_available():
        out["error"] = "CUDA not available"
    else:
        n = torch.cuda.device_count() if dev == "cuda" else int(P.get("cpu_devices", 1))
        secs = out["seconds"]
        N = int(P.get("matmul_n", 8192))
        nbytes = int(P.get("copy_mib", 1024)) * 2**20
        for i in range(n):
            d = {"index": i}
            try:
                if dev == "cuda":
                    device = torch.device("cuda", i)
                    torch.cuda.set_device(device)
                    d["name"] = torch.cuda.get_device_name(i)
                    props = torch.cuda.get_device_properties(i)
                    if hasattr(props, "pci_bus_id"):
                        d["pci"] = "%04x:%02x:%02x" % (getattr(props, "pci_domain_id", 0), props.pci_bus_id, props.pci_device_id)
                    sync = lambda: torch.cuda.synchronize(device)
                else:
                    device = torch.device("cpu")
                    d["name"] = "cpu"
                    sync = lambda: None
                a = torch.randn(N, N, device=device, dtype=torch.bfloat16)
                b = torch.randn(N, N, device=device, dtype=torch.bfloat16)
                c = torch.empty_like(a)
                box = {}
                timer = threading.Timer(secs / 2, lambda: box.update(s=sample()))
                timer.start()
                it, el = timed_loop(lambda: torch.matmul(a, b, out=c), secs, sync)
                timer.join()
                d.update(bf16_tflops=float('%.4g' % (2.0 * N ** 3 * it / el / 1e12)), matmul_seconds=round(el, 3),
                         matmul_n=N, sample=box.get("s"))
                del a, b, c
                x = torch.empty(nbytes, dtype=torch.uint8, device=device)
                y = torch.empty_like(x)
                it, el = timed_loop(lambda: y.copy_(x), secs / 2, sync)
                d.update(copy_tbps=float('%.4g' % (2.0 * nbytes * it / el / 1e12)), copy_seconds=round(el, 3))
                del x, y
                if dev == "cuda":
                    torch.cuda.empty_cache()
            except Exception as e:
                d["error"] = "%s: %s" % (type(e).__name__, str(e)[:500])
            out["devices"].append(d)
        if n > 1 and P.get("allreduce", True):
            t1 = time.time()
            out["allreduce"] = allreduce(n, dev, int(P.get("allreduce_mib", 256)), float(P.get("allreduce_timeout", 60)))
            out["allreduce"]["wall_seconds"] = round(time.time() - t1, 3)
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
out["wall_seconds"] = round(time.time() - T0, 3)
print(json.dumps(out))
"""

"""`gpuops verify --bench` on a Slurm profile: an all-reduce ACROSS the nodes the probe step verified, in ONE second
srun step (pure: text in, text out). The step's script, the worker every task runs, the parser of what comes back and
the judgement (verify/checks_ib.py's transport and bus bandwidth checks, unchanged).

Each task (one per node) runs the worker with the profile's python: torch.distributed, rendezvous on the allocation's
first node (`scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1`, its NodeAddr; the port derived from the job
id), NCCL_DEBUG=INFO so NCCL's lines say the transport it chose. On GPU nodes the task becomes
`python -m torch.distributed.run` with one process per GPU (the NVLink inside a node and the network between nodes,
as a training job uses them), backend nccl; on nodes without CUDA the task itself is the one rank of its node,
backend gloo (TCP). Rank 0 prints one JSON line per size measured.

nccl-tests' all_reduce_perf is not launched: across nodes it must be built with MPI=1 and started by an MPI that
matches the cluster's PMI (`srun --mpi=pmix` or `pmi2`), which cannot be known from outside; a non-MPI build under
srun runs one independent single-node test per task and prints a healthy-looking table that never crossed the network.
"""
from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Optional

from ..verify.facts_ib import AllReduce, IbFacts, NcclRun, parse_nccl_log
from ..verify.results import FAIL, INFO, WARN, CheckResult
from .batch import allocation_options
from .probe_step import SETUP_FAILED, StepSpec, file_step

JOB_NAME = "gpuops-allreduce"
RESULT_MARK = "GPUOPS-ALLREDUCE"  # rank 0: `GPUOPS-ALLREDUCE {json}` per size; any rank: `... {"error": ...}`
GPU_SIZES = (64 << 20, 256 << 20, 1 << 30)  # 1 GiB: where checks_ib judges the bus bandwidth (large messages)
CPU_SIZES = (16 << 20, 64 << 20)  # gloo over TCP: a figure, quickly
LIMIT_S = 180  # the step's --time and the remote timeout's part: torch's start, NCCL's init, 3 sizes
INIT_S = 60  # the rendezvous: a node that cannot reach the first node fails in this time, not in torch's 30 min
PORT_BASE, PORT_SPAN = 20000, 20000

WORKER = r'''import datetime, json, os, socket, sys, time
P = json.loads(%(params)s)
env = os.environ
node = env.get("SLURMD_NODENAME") or socket.gethostname()
rank = int(env.get("RANK", env.get("SLURM_NODEID", "0")))


def say(**kw):
    sys.stdout.write(P["mark"] + " " + json.dumps(kw) + "\n")
    sys.stdout.flush()


try:
    import torch
    import torch.distributed as dist
except Exception as e:
    say(error="no torch in %%s on %%s: %%s" %% (sys.executable, node, e), rank=rank, node=node)
    sys.exit(3)
gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
if gpus and "LOCAL_RANK" not in env:  # one process per GPU: torch.distributed.run, rendezvous on the first node
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", "--nnodes=" + env["SLURM_NNODES"],
                              "--nproc-per-node=%%d" %% gpus, "--node-rank=" + env["SLURM_NODEID"],
                              "--master-addr=" + env["GPUOPS_AR_ADDR"], "--master-port=" + env["GPUOPS_AR_PORT"],
                              os.path.abspath(__file__)])
try:
    world = int(env.get("WORLD_SIZE", env.get("SLURM_NNODES", "1")))
    local = int(env.get("LOCAL_RANK", "0"))
    backend = "nccl" if gpus else "gloo"
    limit = datetime.timedelta(seconds=P["init_s"])
    if gpus:
        torch.cuda.set_device(local)
        dev, sync = torch.device("cuda", local), torch.cuda.synchronize
        sizes, name = P["gpu_sizes"], torch.cuda.get_device_name(local)
    else:
        dev, sync, sizes, name = torch.device("cpu"), (lambda: None), P["cpu_sizes"], None
    budget = P["budget_s"] if gpus else P["cpu_budget_s"]
    if "MASTER_ADDR" in env and "LOCAL_RANK" in env:
        dist.init_process_group(backend, timeout=limit)
    else:
        addr = env["GPUOPS_AR_ADDR"]
        addr = "[%%s]" %% addr if ":" in addr else addr
        dist.init_process_group(backend, init_method="tcp://%%s:%%s" %% (addr, env["GPUOPS_AR_PORT"]), rank=rank,
                                world_size=world, timeout=limit)
    # every rank's node name (64 bytes each: all_gather_object would need numpy)
    mine = torch.tensor(list(node.encode("utf-8")[:64].ljust(64, b"\0")), dtype=torch.uint8, device=dev)
    names = [torch.zeros(64, dtype=torch.uint8, device=dev) for _ in range(world)]
    dist.all_gather(names, mine)
    hosts = [bytes(t.tolist()).rstrip(b"\0").decode("utf-8", "replace") for t in names]
    nodes = sorted(set(hosts), key=hosts.index)
    for size in sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device=dev)
        for _ in range(2):
            dist.all_reduce(x)
        sync()
        t0 = time.perf_counter()
        for _ in range(3):
            dist.all_reduce(x)
        sync()
        per = max((time.perf_counter() - t0) / 3, 1e-6)
        # every rank must run the same number of collectives: agree on the smallest estimate
        n = torch.tensor([max(3, min(100, int(budget / per)))], dtype=torch.int64, device=dev)
        dist.all_reduce(n, op=dist.ReduceOp.MIN)
        iters = int(n.item())
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(x)
        sync()
        el = (time.perf_counter() - t0) / iters
        x.fill_(rank + 1)
        dist.all_reduce(x)
        wrong = int((x != world * (world + 1) // 2).sum().item())
        if rank == 0:
            algbw = size / el / 1e9
            say(bytes=size, seconds=el, iters=iters, algbw=algbw, busbw=algbw * 2 * (world - 1) / world,
                wrong=wrong, backend=backend, world=world, nodes=nodes, gpu=name)
        del x
    dist.destroy_process_group()
except Exception as e:
    say(error="%%s: %%s" %% (type(e).__name__, str(e).strip().splitlines()[0][:300] if str(e).strip() else ""),
        rank=rank, node=node)
    sys.exit(1)
'''

# each task: find the first node's address, the port, NCCL's words on, then become the worker (`sh -c W arg0 PY FILE`)
TASK_WRAPPER = (
    'h=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1); '
    "a=$(scontrol --oneliner show node \"$h\" 2>/dev/null | sed -n 's/.* NodeAddr=\\([^ ]*\\).*/\\1/p'); "
    'if [ -n "$a" ]; then h=$a; fi; '
    'GPUOPS_AR_ADDR=$h; GPUOPS_AR_PORT=$(( %(base)d + (SLURM_JOB_ID + %(salt)d) %% %(span)d )); '
    "NCCL_DEBUG=INFO; NCCL_DEBUG_SUBSYS=INIT,NET; "
    'export GPUOPS_AR_ADDR GPUOPS_AR_PORT NCCL_DEBUG NCCL_DEBUG_SUBSYS; exec "$@"')


def worker_source(*, gpu_sizes=GPU_SIZES, cpu_sizes=CPU_SIZES, budget_s: float = 1.0, cpu_budget_s: float = 0.25,
                  init_s: int = INIT_S) -> str:
    """The file every task runs (written from stdin into the shared folder): the worker with its parameters (the
    timed loop of each size runs about budget_s on GPUs, cpu_budget_s on gloo)."""
    params = json.dumps({"mark": RESULT_MARK, "gpu_sizes": [int(s) for s in gpu_sizes],
                         "cpu_sizes": [int(s) for s in cpu_sizes], "budget_s": float(budget_s),
                         "cpu_budget_s": float(cpu_budget_s), "init_s": int(init_s)})
    return WORKER % {"params": repr(params)}


def srun_argv(spec: StepSpec) -> list[str]:
    """srun's options for the all-reduce step: one task per node over the nodes the probe verified (spec.nodelist),
    a task that fails ends the others (a rank alone would wait for its peers until its time)."""
    argv = ["srun", f"--job-name={JOB_NAME}", f"--nodes={spec.nodes}", "--ntasks-per-node=1", "--label",
            "--input=none", f"--immediate={max(1, int(spec.wait_s))}", f"--time={spec.time_minutes()}",
            "--kill-on-bad-exit=1"]
    return argv + allocation_options(partition=spec.partition, account=spec.account, qos=spec.qos,
                                     gpus_per_node=spec.gpus_per_node, gpu_type=spec.gpu_type,
                                     gpu_option=spec.gpu_option, exclude=spec.exclude, nodelist=spec.nodelist,
                                     check=False)


def step_script(spec: StepSpec, *, folder: str, python: str, token: str, salt: int = 0) -> str:
    """The one remote execution: write the worker from stdin into `folder` (a shell word: shell_path's), srun it on
    every node, remove it. Every value is quoted; the python is the profile's, its first word keeping a leading ~."""
    wrapper = TASK_WRAPPER % {"base": PORT_BASE, "span": PORT_SPAN, "salt": int(salt) % PORT_SPAN}
    return file_step(srun_argv(spec), folder=folder, python=python, rel=f".gpuops/verify/allreduce-{token}.py",
                     wrapper=wrapper, name="gpuops-allreduce", what="the all-reduce")


# -- what comes back ----------------------------------------------------------------------------------------------
@dataclass
class AllReduceRun:
    allreduce: AllReduce = field(default_factory=AllReduce)  # one row per size measured
    nccl: Optional[NcclRun] = None  # None: no NCCL line came (gloo)
    backend: Optional[str] = None  # nccl | gloo
    world: int = 0
    nodes: list = field(default_factory=list)
    gpu: Optional[str] = None
    errors: list = field(default_factory=list)  # the ranks' errors, srun's
    job_id: Optional[str] = None
    rc: Optional[int] = None
    started: bool = False  # a task ran (Slurm gave the nodes)

    def to_dict(self) -> dict:
        """The cluster document's `allreduce`."""
        sizes = [{"size_bytes": r["size"], "time_s": r["ip"].get("time", 0) / 1e6, "iters": r.get("iters"),
                  "algbw_gbs": r["ip"].get("algbw"), "busbw_gbs": r["ip"].get("busbw"), "wrong": r["ip"].get("wrong")}
                 for r in self.allreduce.rows]
        return {"backend": self.backend, "world": self.world, "nodes": list(self.nodes), "gpu": self.gpu,
                "transport": self.nccl.transport if self.nccl is not None else None,
                "busbw_gbs": self.allreduce.peak_busbw(1 << 30), "sizes": sizes, "errors": list(self.errors),
                "job_id": self.job_id}


_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_QUEUED = re.compile(r"srun: job (\d+) (?:queued|has been allocated)")
_NCCL_LINE = re.compile(r"\bNCCL (?:INFO|WARN)\b|NCCL version")


def parse_step(stdout: str, stderr: str) -> AllReduceRun:
    """The step's output (srun --label) -> the rows rank 0 printed, NCCL's lines, the errors."""
    run = AllReduceRun()
    nccl_lines = []
    for line in (stdout or "").splitlines() + (stderr or "").splitlines():
        m = _LABEL.match(line)
        text = m.group(2) if m else line
        if m:
            run.started = True
        if _NCCL_LINE.search(text):
            nccl_lines.append(text)
        if not text.startswith(RESULT_MARK + " "):
            continue
        try:
            doc = json.loads(text[len(RESULT_MARK) + 1:])
        except ValueError:
            continue
        if doc.get("error"):
            where = f"rank {doc.get('rank')} on {doc.get('node')}" if doc.get("node") else "a rank"
            run.errors.append(f"{where}: {doc['error']}")
        elif isinstance(doc.get("bytes"), int):
            _add_row(run, doc)
    for line in (stderr or "").splitlines():
        q = _QUEUED.search(line)
        if q:
            run.job_id = q.group(1)
        if line.startswith("srun: error:") or (not _LABEL.match(line) and "error:" in line):
            run.errors.append(line.strip())
    if nccl_lines:
        run.nccl = parse_nccl_log("\n".join(nccl_lines))
    if not run.allreduce.rows and not run.errors:
        tail = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
        run.errors.append(tail[-1] if tail else "no result and no error from any rank")
    return run


def _add_row(run: AllReduceRun, doc: dict) -> None:
    size = int(doc["bytes"])
    ip = {"time": float(doc.get("seconds") or 0) * 1e6, "algbw": _f(doc.get("algbw")), "busbw": _f(doc.get("busbw")),
          "wrong": int(doc.get("wrong") or 0)}  # torch's all_reduce is in place; time in us, as nccl-tests says it
    run.allreduce.rows.append({"size": size, "count": size // 4, "type": "float", "redop": "sum",
                               "iters": doc.get("iters"), "oop": {}, "ip": ip})
    run.backend = doc.get("backend") or run.backend
    run.world = int(doc.get("world") or run.world)
    run.nodes = list(doc.get("nodes") or run.nodes)
    run.gpu = doc.get("gpu") or run.gpu
    run.allreduce.ranks = run.world
    run.allreduce.hosts = list(run.nodes)
    run.allreduce.gpus = [run.gpu] * run.world if run.gpu else []


def _f(v) -> Optional[float]:
    return float(v) if isinstance(v, (int, float)) else None


# -- the judgement ----------------------------------------------------------------------------------------------------
TITLE = "all-reduce across the nodes"
BUSY_WORDS = ("busy", "queued and waiting", "temporarily unavailable")


def judge_run(run: AllReduceRun, *, ib: Optional[IbFacts], reference: dict, gpu_name: Optional[str],
              gpus_per_node: Optional[int]) -> list[CheckResult]:
    """The run's lines for the cluster's report: NCCL's transport between the nodes (when NCCL spoke) and the bus
    bandwidth against the node type's reference (checks_ib); on gloo the measured figure, as INFO."""
    from ..verify.checks_ib import check_busbw, check_transport

    if not run.allreduce.rows:
        return [_failed(run)]
    out = []
    if run.nccl is not None:
        out.append(check_transport(ib or IbFacts(), run.nccl, multi_node=True))
    if run.backend == "nccl":
        res = check_busbw(run.allreduce, reference or {}, gpu_name=gpu_name or run.gpu, gpus_per_node=gpus_per_node,
                          multi_node=True)
        res.title = f"NCCL all_reduce bus bandwidth across {len(run.nodes)} nodes"
        out.append(res)
        return out
    out.append(_gloo_line(run))
    return out


def _gloo_line(run: AllReduceRun) -> CheckResult:
    ar = run.allreduce
    big = max(ar.rows, key=lambda r: r["ip"].get("busbw") or 0)  # the peak, as network.busbw says it on NCCL
    measured = (f"{big['ip']['busbw']:.2f} GB/s bus bandwidth ({big['ip']['algbw']:.2f} GB/s algbw) at "
                f"{_size(big['size'])}, {run.world} ranks on {len(run.nodes)} nodes ({', '.join(run.nodes)}); "
                f"gloo over TCP: no NCCL on this cluster (no CUDA in the profile's python there), so no node type's "
                f"reference applies")
    if ar.wrong:
        return CheckResult("network.busbw", f"all_reduce across {len(run.nodes)} nodes (gloo)", FAIL,
                           f"{measured}; {ar.wrong} wrong result(s)", "0 wrong results",
                           remediation="the sum came back wrong: a node's memory or network path corrupts data; "
                           "run verify on fewer nodes (slurm.nodelist) to find which")
    return CheckResult("network.busbw", f"all_reduce across {len(run.nodes)} nodes (gloo)", INFO, measured)


def _failed(run: AllReduceRun) -> CheckResult:
    said = "; ".join(run.errors[:3]) or "no result"
    if not run.started and any(w in e for e in run.errors for w in BUSY_WORDS):
        return CheckResult("network.allreduce", TITLE, WARN, f"not run: Slurm did not give the nodes again: {said}",
                           remediation="the nodes were taken between verify's two steps: run verify --bench again "
                           "when the partition has free nodes (--alloc-wait SECONDS waits longer)")
    fix = "the nodes could not all-reduce: "
    if any("no torch" in e for e in run.errors):
        fix += "the profile's python has no torch on the nodes: set python: to one with torch (the job's own)"
    elif any(w in said for w in ("Timeout", "timed out", "Connection refused", "connect", "Socket", "timeout")):
        fix += ("a node could not reach the first node's rendezvous port (a firewall between the nodes, or the "
                "address Slurm gives, NodeAddr, is not one the nodes reach each other on); NCCL_SOCKET_IFNAME / "
                "GLOO_SOCKET_IFNAME name the interface to use")
    else:
        fix += "see the ranks' words above; a training job across these nodes fails the same way"
    return CheckResult("network.allreduce", TITLE, FAIL, f"no result: {said}", "a bus bandwidth figure",
                       remediation=fix, detail="; ".join(run.errors[3:8]) or None)


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} B"

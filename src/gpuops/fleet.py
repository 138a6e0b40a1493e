"""Fleets: one per-host operation over every host of a profile, in a bounded pool, a result per host.

Commands keep their one-host code and gain fleets through `for_each`; nothing else branches on the number of hosts.
Each host gets its own connection (with its own connect and command time limits, as on one host); a failure on one
host is that host's result, never the others' crash. The worst result decides the exit code.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .errors import ExitCode, GpuopsError

DEFAULT_PARALLEL = 8  # work that moves data or loads this machine (sync, setup, train): 8 hosts at a time
# work whose share on this machine is a connection and a small document per host (verify): every host at once, up to
# the largest fleet `up --nodes` makes. 8 at a time made a 16-host verify two waves of one host's time each
# (benchmarks/bench_fleet.py, docs/fleets.md)
WIDE_PARALLEL = 64
# worst first: an interrupted fleet, then unreachable hosts, then bad input, then failed checks or jobs
_SEVERITY = {int(ExitCode.INTERRUPTED): 5, int(ExitCode.CONNECTION): 4, int(ExitCode.USAGE): 3, int(ExitCode.FAILED): 2,
             int(ExitCode.OK): 0}


@dataclass
class NodeResult:
    rank: int
    host: str
    value: Any = None
    error: Optional[BaseException] = None
    code: int = 0
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None and self.code == 0

    @property
    def message(self) -> str:
        if self.error is None:
            return ""
        return getattr(self.error, "message", None) or str(self.error) or type(self.error).__name__

    def to_json(self) -> dict:
        return {"rank": self.rank, "host": self.host, "code": self.code, "seconds": round(self.seconds, 3),
                "error": self.message or None}


def worst_code(codes) -> int:
    worst = 0
    for c in codes:
        if _SEVERITY.get(int(c), 1) > _SEVERITY.get(worst, 1):
            worst = int(c)
    return worst


def label(node) -> str:
    """How a host is named in output: `#1 10.0.0.2` (its number for --host, its address)."""
    port = f":{node.port}" if node.port != 22 else ""
    return f"#{node.rank} {node.host}{port}"


def for_each(nodes: list, fn: Callable[[Any], Any], *, parallel: int = DEFAULT_PARALLEL,
             code_of: Callable[[Any], int] = lambda v: 0) -> list[NodeResult]:
    """fn(node) on every node, at most `parallel` at a time; results in rank order. A GpuopsError (or any exception)
    becomes that node's result with its exit code; KeyboardInterrupt propagates."""

    def one(node) -> NodeResult:
        t0 = time.monotonic()
        try:
            value = fn(node)
            return NodeResult(node.rank, node.host, value=value, code=int(code_of(value)), seconds=time.monotonic() - t0)
        except GpuopsError as exc:
            return NodeResult(node.rank, node.host, error=exc, code=int(exc.code), seconds=time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - one host's unexpected failure is its own result
            return NodeResult(node.rank, node.host, error=exc, code=int(ExitCode.FAILED), seconds=time.monotonic() - t0)

    if len(nodes) == 1:
        return [one(nodes[0])]
    with ThreadPoolExecutor(max_workers=max(1, min(parallel, len(nodes))), thread_name_prefix="gpuops-node") as pool:
        return list(pool.map(one, nodes))


class Buffered:
    """An Output per host whose lines are kept, so parallel hosts print in sections, in rank order."""

    def __init__(self, json_mode: bool = False, debug: bool = False):
        import io

        from .console import Output

        self.out_buf, self.err_buf = io.StringIO(), io.StringIO()
        self.output = Output(json_mode=json_mode, stdout=self.out_buf, stderr=self.err_buf, debug=debug)

    def replay(self, out) -> None:
        for line in self.err_buf.getvalue().splitlines():
            print(line, file=out.stderr, flush=True)
        text = self.out_buf.getvalue()
        if text and not out.json_mode:
            out.stdout.write(text)
            out.stdout.flush()


# -- the fleet as a whole (pure) ----------------------------------------------------------------------------
def _values(reports: list[dict], pick) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {}
    for rank, rep in enumerate(reports):
        if rep is None:
            continue
        try:
            v = pick(rep["facts"])
        except (KeyError, TypeError, IndexError):
            v = None
        seen.setdefault("-" if v in (None, "") else str(v), []).append(rank)
    return seen


def _describe(seen: dict[str, list[int]]) -> str:
    return "; ".join(f"{v} on #{', #'.join(map(str, ranks))}" for v, ranks in seen.items())


def compare(reports: list[Optional[dict]]) -> list:
    """Fleet checks over the hosts' verify reports (None: host unreachable): the same GPU model and count, driver,
    CUDA, Python and package versions everywhere, differences named per host."""
    from .verify.results import FAIL, PASS, WARN, CheckResult

    def gpus(f):
        names = sorted({g["name"] for g in f.get("gpus") or []})
        return ", ".join(names) or None

    aspects = [
        ("gpu_model", "GPU model", gpus, FAIL),
        ("gpu_count", "GPU count", lambda f: len(f.get("gpus") or []), FAIL),
        ("driver", "NVIDIA driver", lambda f: f.get("driver"), WARN),
        ("cuda", "CUDA (driver)", lambda f: f.get("cuda_driver"), WARN),
        ("python", "Python", lambda f: (f.get("python") or {}).get("version"), WARN),
    ]
    names = sorted({n for r in reports if r for n in ((r.get("facts") or {}).get("packages") or {})})
    for n in names:
        aspects.append((f"pkg.{n}", n, lambda f, n=n: (f.get("packages") or {}).get(n), FAIL))
    results = []
    for key, title, pick, bad in aspects:
        seen = _values(reports, pick)
        if len(seen) <= 1:
            if key.startswith("pkg.") and set(seen) == {"-"}:
                continue
            results.append(CheckResult(f"fleet.{key}", f"same {title} on every host", PASS,
                                       measured=next(iter(seen), "-")))
        else:
            results.append(CheckResult(f"fleet.{key}", f"same {title} on every host", bad, measured=_describe(seen),
                                       remediation="make every host match rank 0 (gpuops setup, or replace the odd "
                                                   "host): a mixed fleet fails or slows in collective operations"))
    return results


def reach_results(reports: list[Optional[dict]], master: str, port: int) -> list:
    """Does each node reach rank 0 on the rendezvous port? `refused` counts: the path works, nothing listens yet."""
    from .verify.results import FAIL, PASS, CheckResult

    results = []
    for rank, rep in enumerate(reports):
        if rank == 0 or rep is None:
            continue
        fact = rep.get("reach") or {}
        val = fact.get("value") or {}
        res = val.get("result") if fact.get("ok") else (fact.get("error") or "not measured")
        ok = res in ("connected", "refused")
        results.append(CheckResult(
            f"fleet.reach.{rank}", f"#{rank} reaches rank 0 at {master}:{port}", PASS if ok else FAIL,
            measured=f"{res}" + (f" in {val['ms']:.0f} ms" if ok and "ms" in val else ""),
            remediation=None if ok else f"open TCP {port} between the nodes (firewall / security group) and use "
                                        f"addresses on the same private network (private_ip: in the profile)"))
    return results


def for_each_buffered(prof, out, fn: Callable[[Any, Any], Any], render: Callable[[Any, Any], None], *, title: str,
                      parallel: int = DEFAULT_PARALLEL) -> int:
    """fn(node, node_output) on every host of a fleet profile; each host's output printed as a section in rank order
    (or one JSON document {"hosts": [...]}), then a summary line. Returns the worst exit code."""
    nodes = prof.nodes()

    def one(node):
        buf = Buffered(json_mode=out.json_mode, debug=out.debug)
        return fn(node, buf.output), buf

    with out.status(f"{title} on {len(nodes)} hosts in parallel"):
        got = for_each(nodes, one, parallel=parallel)
    if out.json_mode:
        out.emit_json({"profile": prof.name, "hosts": [{**r.to_json(), "result": r.value[0] if r.value else None}
                                                       for r in got], "code": worst_code(r.code for r in got)})
        return worst_code(r.code for r in got)
    for node, r in zip(nodes, got):
        out.print(f"=== host {label(node)} ===")
        if r.value:
            value, buf = r.value
            render(buf.output, value)
            buf.replay(out)
        else:
            out.error(f"host #{r.rank} ({r.host}): {r.message}", getattr(r.error, "hint", None))
    ok = sum(1 for r in got if r.ok)
    out.print(f"{title}: {ok}/{len(nodes)} hosts ok")
    return worst_code(r.code for r in got)

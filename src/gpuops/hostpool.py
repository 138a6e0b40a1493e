"""The host pool: one per-host operation over every host of a profile, in a bounded pool, a result per host.

Commands keep their one-host code and gain fleets through `for_each`; nothing else branches on the number of hosts.
Each host gets its own connection (with its own connect and command time limits, as on one host); a failure on one
host is that host's result, never the others' crash. The worst result decides the exit code.

The ground floor: it knows hosts, results and exit codes, nothing of what is done on a host. The fleet's own checks
(the same stack everywhere, every node reaching rank 0) are verify's judgement: verify/fleet_checks.py.
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
MASTER_PORT = 29500  # torch's default rendezvous port: rank 0 listens on it (the launchers), every node reaches it (verify)
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

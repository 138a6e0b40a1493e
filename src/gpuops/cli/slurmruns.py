"""`gpuops train | status | logs | stop | watch` on a Slurm cluster's profile (a `slurm:` section): cli/jobs.py hands
the command here once the profile is picked; this module calls slurm/runs.py and renders. Registers no command."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .app import with_warnings


def train(prof, out, *, json_: bool, dry_run: bool, nodes: Optional[int], launcher: Optional[str], nproc: str,
          master_port: Optional[int], exclude: list, **opts) -> None:
    from ..errors import UsageError
    from ..slurm import runs

    if launcher not in (None, "none", "torchrun"):
        raise UsageError(f"--launcher {launcher}: a Slurm job starts with torchrun (c10d on the allocation's first "
                         "node) or the command once per node (none); Ray is not offered on Slurm yet")
    # --force: passes the local plan's refusals a resolution or a pin decides (slurm/runs.py refuse_plan)
    opts.pop("snapshot", None)
    res = runs.train(prof, out, Path.cwd(), nodes=nodes, launcher=launcher, exclude=exclude, dry_run=dry_run,
                     nproc=None if nproc == "auto" else int(nproc), master_port=master_port, **opts)
    if dry_run:
        if json_:
            out.emit_json(with_warnings(res, out))
        else:
            out.stdout.write(res["batch_script"])
            out.stdout.flush()
            out.info(f"dry run: nothing synced, written or submitted (would be: {' '.join(res['sbatch'])} in "
                     f"{res['remote_run_dir']})")
        raise typer.Exit(0)
    if json_:
        out.emit_json(with_warnings(res, out))
    else:
        out.success(f"submitted {res['run_id']} to Slurm on {prof.name}: job {res['job_id']}")
        out.info(f"  run folder {res['remote_run_dir']}; log {res['log']}")
        out.print(res["run_id"])
        out.info("next: " + "   ".join(res["next"]))
    raise typer.Exit(0)


def status(prof, out, run: Optional[str], json_: bool) -> None:
    from .. import jsonvocab
    from ..slurm import runs, runstate

    doc = runs.status(prof, out, Path.cwd(), run)
    if json_:
        out.emit_json(with_warnings(jsonvocab.status(doc), out))
        raise typer.Exit(0)
    from ..jobs.plan import fmt_duration
    from ..jobs.watchtext import ending_lines

    rows = doc["runs"]
    if not rows:
        out.print(f"no Slurm runs of profile '{prof.name}' recorded here (gpuops train --script train.py)")
        raise typer.Exit(0)
    ids = max([36] + [len(r["run_id"]) for r in rows])
    out.print(f"{'RUN':<{ids}} {'JOB':>8} {'STATE':<10} {'SLURM':<13} {'ELAPSED':>9} {'GPU-H':>8} EXIT")
    for r in rows:
        s = r.get("slurm") or {}
        hours = "-" if s.get("gpu_hours") is None else f"{s['gpu_hours']:.3f}"
        out.print(f"{r['run_id']:<{ids}} {s.get('job_id') or '-':>8} {r['state']:<10} {s.get('state') or '-':<13} "
                  f"{fmt_duration(r['elapsed']):>9} {hours:>8} {'-' if r['exit_code'] is None else r['exit_code']}")
    for r in rows:
        for line in runstate.words(r):
            out.print(line)
        for line in ending_lines(r.get("ending"), indent="    "):
            out.print(f"{r['run_id']}: {line}" if line.startswith("why") else line)
    raise typer.Exit(0)


def logs(prof, out, meta: dict, *, follow: bool, lines: int, write) -> None:
    from ..slurm import runs

    if not follow:
        runs.tail(prof, out, meta, lines, write)
        raise typer.Exit(0)
    try:
        res = runs.follow(prof, out, meta, lines, write, on_state=lambda s, r: _state_line(out, meta, s, r))
    except KeyboardInterrupt:
        _interrupted(out, meta, "following the log")
    out.info(f"run {meta['run_id']}: Slurm job {runs.job_id_of(meta)} {res['state'] or 'no longer known'}"
             + (f", exit {res['exit_code']}" if res["exit_code"] is not None else ""))
    raise typer.Exit(res["code"])


def _interrupted(out, meta: dict, what: str) -> None:
    from ..slurm import runs

    out.info(f"stopped {what}; run {meta['run_id']} (Slurm job {runs.job_id_of(meta)}) keeps running "
             f"(gpuops stop {meta['run_id']} ends it)")
    raise typer.Exit(130)


def _state_line(out, meta: dict, state: str, reason: Optional[str]) -> None:
    from ..slurm import states

    if state == "PENDING":
        from ..slurm.reasons import explain_pending, load_reasons

        code, detail = states.split_reason(reason)
        words = explain_pending(states.QueueJob(job_id="", state=state, reason=code, reason_detail=detail),
                                load_reasons(Path.cwd()))
        out.info(f"Slurm: {words.line()}")
    else:
        out.info(f"Slurm: job {state.lower()}")


def watch(prof, out, meta: dict, *, lines: int, write, interval: float, json_: bool = False) -> None:
    """A first watch on Slurm: the job's state as it changes, every node's GPUs (sampled through the job's own
    allocation) and the log as it grows, then its ending. json_: watch's JSON lines (schemas/watch.schema.json):
    `state` (with `slurm_state` and `reason`), `log`, `sample` (with the GPU's `node`), `ending` last."""
    from ..slurm import runs

    lines_out = _JsonLines(out, meta) if json_ else None
    on_state = lines_out.state if lines_out else (lambda s, r: _state_line(out, meta, s, r))
    on_gpus = lines_out.gpus if lines_out else (lambda g: _gpu_lines(out, g))
    try:
        res = runs.follow(prof, out, meta, lines, lines_out.log if lines_out else write, on_state=on_state,
                          gpus_every=max(interval, 2.0), on_gpus=on_gpus)
    except KeyboardInterrupt:
        _interrupted(out, meta, "watching")
    doc = runs.status(prof, out, Path.cwd(), meta["run_id"])
    from ..jobs.watchtext import ending_lines
    from ..slurm import runstate

    for r in doc["runs"]:
        if lines_out:
            lines_out.last(r)
            continue
        for line in runstate.words(r) + ending_lines(r.get("ending")):
            out.info(line)
    raise typer.Exit(res["code"])


def watch_once(prof, out, meta: dict, *, lines: int, write, json_: bool = False) -> None:
    """`watch --once` on a Slurm profile: one snapshot, then exit: the job's state in words (or its ending), every
    node's GPUs while it runs (one step in its own allocation), the log's last lines. Exit 0 while it waits or runs
    and when it succeeded, 1 otherwise (as a host's --once)."""
    from ..jobs import plan as core
    from ..jobs.watchtext import ending_lines
    from ..slurm import runs, runstate

    doc = runs.status(prof, out, Path.cwd(), meta["run_id"])
    row = next(r for r in doc["runs"] if r["run_id"] == meta["run_id"])
    s = row.get("slurm") or {}
    gpus = runs.snapshot_gpus(prof, out, meta, int(s.get("nodes") or 1)) if row["state"] == core.RUNNING else {}
    lines_out = _JsonLines(out, meta) if json_ else None
    if lines_out:
        lines_out.gpus(gpus)
        runs.tail(prof, out, meta, lines, lines_out.log)
        lines_out.last(row)
    else:
        _gpu_lines(out, gpus)
        runs.tail(prof, out, meta, lines, write)
        for line in runstate.words(row) + ending_lines(row.get("ending")):
            out.info(line)
    raise typer.Exit(0 if row["state"] in (core.RUNNING, core.SUCCEEDED, runstate.PENDING) else 1)


class _JsonLines:
    """watch --json on a Slurm profile: each event one JSON object on stdout, as a host's watch prints them."""

    def __init__(self, out, meta: dict):
        self.out, self.meta, self.buf = out, meta, b""

    def _emit(self, doc: dict) -> None:
        import time

        from ..jsonvocab import iso

        self.out.emit_json_line({"type": doc.pop("type"), "at": iso(time.time(), "milliseconds"), **doc})

    def log(self, data: bytes) -> None:
        *done, self.buf = (self.buf + data).split(b"\n")
        for raw in done:
            self._emit({"type": "log", "line": raw.decode("utf-8", "replace").rstrip("\r"), "offset": None,
                        "kind": None})

    def state(self, state: str, reason) -> None:
        from ..slurm import runstate, states

        word = runstate.gpuops_state(state if state != "UNKNOWN" else None, None, False)
        self._emit({"type": "state", "run_id": self.meta["run_id"], "state": word, "exit_code": None,
                    "started_at": None, "ended_at": None, "elapsed_s": None, "slurm_state": state,
                    "reason": states.split_reason(reason)[0]})

    def gpus(self, by_node: dict) -> None:
        from ..jsonvocab import renamed

        for node, gpus in by_node.items():
            for g in gpus:
                self._emit({"type": "gpu_error", "message": f"{node}: {g['error']}", "node": node} if "error" in g
                           else {"type": "sample", **renamed(g), "node": node})

    def last(self, row: dict) -> None:
        if self.buf:
            self.log(b"\n")
        s = row.get("slurm") or {}
        self._emit({"type": "state", "run_id": row["run_id"], "state": row["state"], "exit_code": row["exit_code"],
                    "started_at": None, "ended_at": None, "elapsed_s": row.get("elapsed"),
                    "slurm_state": s.get("state"), "reason": s.get("reason"), "slurm": s})
        if row.get("ending"):
            self._emit({"type": "ending", **row["ending"]})


def _gpu_lines(out, by_node: dict) -> None:
    """One line per node on stderr: its GPUs' utilisation and memory (the log keeps stdout)."""
    for node, gpus in by_node.items():
        ok = [g for g in gpus if "error" not in g]
        if not ok:
            out.info(f"{node}: GPUs not read: {(gpus[0]['error'] if gpus else 'no answer')[:200]}")
            continue
        util = " ".join("?" if g["util"] is None else f"{g['util']:.0f}" for g in ok)
        used = sum(g["mem_used"] or 0 for g in ok)
        total = sum(g["mem_total"] or 0 for g in ok)
        out.info(f"{node}: {len(ok)} GPU(s) util {util} %, memory {used / 1024:.1f}/{total / 1024:.1f} GiB")


def stop(prof, out, meta: dict, grace: float, json_: bool) -> None:
    from ..slurm import runs

    doc = runs.stop(prof, out, Path.cwd(), meta, grace)
    if json_:
        out.emit_json(with_warnings(doc, out))
    elif doc["result"] == "notrunning":
        out.info(f"{doc['run_id']} is not running (Slurm job {doc['job_id']}: {doc['slurm_state'] or 'forgotten'})")
    elif doc["result"] == "pending":
        out.success(f"cancelled {doc['run_id']} (Slurm job {doc['job_id']}) before it started")
    else:
        out.success(f"stopped {doc['run_id']} (Slurm job {doc['job_id']}) with SIG{doc['result']} "
                    f"({doc['slurm_state'] or 'ended'})")
    raise typer.Exit(0)

"""A run on every host of a fleet profile (one run id), split from jobs/actions.py when it passed 800 lines: the
fleet's launch (`train_fleet`: sync and preflight everywhere in parallel, then each node's part) and what the other
commands do on every node (`fleet_states`, `wait_fleet`, `tail_all`, `stop_fleet`, `status_fleet`). One host's steps
are jobs/actions.py's; these call them per node."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Optional

from . import envplan
from . import plan as core
from .actions import _Gate, _endings, _prepare_run, _remember, _snapshot, connect, status, stop
from ..errors import RemoteError


def train_fleet(prof, out, project: Path, *, script: str, launcher: str = "none", nproc: str = "auto",
                name: Optional[str] = None, env: Iterable[str] = (), args: Iterable[str] = (), sync: bool = True,
                force: bool = False, seed: Optional[int] = None, snapshot: bool = True,
                master_port: Optional[int] = None, clock: Callable[[], datetime] = datetime.now) -> dict:
    """One run on every host of the profile (one run id): sync and preflight everywhere in parallel, then launch each
    node's part (torchrun / a Ray head and workers / the script itself) with its rank, addresses and ports. If any
    node fails to launch, the nodes already launched are stopped and the run fails."""
    from . import launchers

    script_rel, presets_doc, started, rid, plan = _prepare_run(prof, out, project, script=script, name=name, env=env,
                                                               sync=sync, seed=seed, clock=clock)
    fl = _FleetLaunch(prof.nodes(), out, project, script_rel=script_rel, presets_doc=presets_doc, started=started,
                      rid=rid, plan=plan, launcher=launcher, args=list(args), force=force, seed=seed, name=name,
                      master_port=master_port)
    fl.join_wait = launchers.join_timeout(plan.exported) if launcher == "ray" else None  # a bad value: exit 2 now
    try:
        counts = fl.prepare(sync=sync)
        per_node = fl.layout(counts, nproc)
        meta = fl.launch(counts)
        record = core.save_local(meta, project)
        if snapshot:
            _snapshot(fl.remotes[0], fl.nodes[0], out, project, rid, meta["remote_run_dir"], seed)
    finally:
        for r in fl.remotes.values():
            r.close()
    _remember(prof, project)
    return {"run_id": rid, "profile": prof.name, "launcher": launcher, "nproc_per_node": per_node,
            "nodes": meta["nodes"], "pid": meta["pid"], "remote_run_dir": meta["remote_run_path"],
            "local_record": str(record), "secrets": sorted(plan.secrets),
            "next": [f"gpuops watch {rid}", f"gpuops logs --all {rid}", f"gpuops stop {rid}"]}


@dataclass
class _FleetLaunch:
    """train_fleet's steps over the nodes, and what they share: a connection per node, what --force launched past,
    the nodes launched so far (stopped again when another fails)."""
    nodes: list
    out: object
    project: Path
    script_rel: str
    presets_doc: dict
    started: datetime
    rid: str
    plan: object
    launcher: str
    args: list
    force: bool
    seed: Optional[int]
    name: Optional[str]
    master_port: Optional[int]
    join_wait: Optional[float] = None
    remotes: dict = field(default_factory=dict)
    forced: dict = field(default_factory=dict)
    launched: list = field(default_factory=list)
    fleet: object = None  # launchers.Fleet, once laid out

    def prepare(self, *, sync: bool) -> list[int]:
        """Connect, sync and preflight every node in parallel; the GPUs each node's job is given."""
        from .. import hostpool
        from . import launchers

        gate = _Gate(self.project, self.script_rel, self.plan)
        quiet = type(self.out)(json_mode=True, stdout=self.out.stderr, stderr=self.out.stderr, quiet=True)

        def prepare(node):
            remote = self.remotes[node.rank] = connect(node, self.out)
            remote_dir = node.remote_dir_for(self.project)
            if sync:
                from ..transfer.sync import sync_project

                sync_project(node, remote, quiet, self.project)
            need = [launchers.NEEDS[self.launcher]] if self.launcher in launchers.NEEDS else []
            pf, verdict = gate.preflight(remote, node, remote_dir, envplan.conflict_packages(self.presets_doc) + need,
                                         force=self.force, sync=sync, launcher=self.launcher)
            if verdict.error:
                raise verdict.error
            self.forced[node.rank] = verdict.forced
            return pf, verdict.warnings

        self.out.step(f"{'syncing and ' if sync else ''}preflight on {len(self.nodes)} hosts in parallel")
        prepared = hostpool.for_each(self.nodes, prepare)
        bad = [r for r in prepared if r.error]
        for r in prepared:
            for w in (r.value[1] if r.value else []):
                self.out.warn(f"host #{r.rank}: {w}")
        if bad:
            raise _fleet_error("not launching", bad, last=True)
        return [r.value[0].job_gpus for r in prepared]  # the GPUs each node's job is given (CUDA_VISIBLE_DEVICES)

    def layout(self, counts: list[int], nproc: str) -> int:
        """Processes per node and the rendezvous; shown with the environment. Returns the processes per node."""
        from . import launchers

        if nproc == "auto":
            per_node = max(1, min(counts)) if counts else 1
            if len(set(counts)) > 1:
                self.out.warn(f"hosts see different GPU counts ({', '.join(map(str, counts))}); "
                              f"--nproc-per-node auto uses {per_node}")
        else:
            per_node = int(nproc)
        self.fleet = launchers.Fleet(addresses=tuple(n.address for n in self.nodes),
                                     master_port=self.master_port or launchers.MASTER_PORT, gpus_per_node=per_node)
        fl = self.fleet
        self.out.info(f"environment for {self.rid} ({self.launcher if self.launcher != 'none' else 'the script'} on "
                      f"{len(self.nodes)} hosts, {per_node} process(es) per host, rendezvous "
                      f"{fl.master_addr}:{fl.master_port}):")
        for line in self.plan.lines():
            self.out.info("  " + line)
        return per_node

    def launch(self, counts: list[int]) -> dict:
        """Each node's part, in parallel; the run's local record (node 0's meta and every node's place). A node that
        fails to launch stops the ones launched, and the run fails."""
        from .. import hostpool
        from . import launchers
        from . import scripts as rl

        project, rid = self.project, self.rid
        ray_dirs = tuple(launchers.ray_temp_dir(rid, n.rank, f"{n.user}@{n.host}:{n.port}:{n.remote_dir_for(project)}")
                         for n in self.nodes)
        git = core.git_info(project)

        def launch_node(node):
            remote_dir = node.remote_dir_for(project)
            argv, command = self._node_command(node, counts, ray_dirs)
            env_vars = {**self.plan.exported, **launchers.node_env(self.fleet, node.rank)}
            run_dir = rl.run_dir_of(remote_dir, rid)
            meta = core.build_meta(run_id=rid, script=self.script_rel, args=self.args, argv=argv, profile=node,
                                   plan=self.plan, remote_dir=remote_dir, remote_run_dir=run_dir, git=git,
                                   seed=self.seed, started=self.started, name=self.name)
            meta.update(env=env_vars, node_rank=node.rank, num_nodes=len(self.nodes), launcher=self.launcher)
            if self.forced.get(node.rank):
                meta["forced"] = self.forced[node.rank]
            if command:
                meta["command_shell"] = command
            text = rl.launcher_script(run_id=rid, remote_dir=remote_dir, argv=argv, python=node.python, env=env_vars,
                                      unset=self.plan.unset, command=command,
                                      prelude=launchers.ifname_prelude(node.address))
            pid, abs_dir = rl.launch(self.remotes[node.rank], run_id=rid, remote_dir=remote_dir, meta=meta,
                                     launcher=text, secrets=self.plan.secrets, python=node.python, force=self.force)
            self.launched.append((node, run_dir))
            return {"rank": node.rank, "host": node.host, "port": node.port, "user": node.user,
                    "remote_dir": remote_dir, "remote_run_dir": run_dir, "remote_run_path": abs_dir, "pid": pid}, meta

        self.out.step(f"launching {rid} on {len(self.nodes)} hosts")
        done = hostpool.for_each(self.nodes, launch_node)
        bad = [r for r in done if r.error]
        if bad:
            self._stop_launched(len(bad))
            raise _fleet_error(f"run {rid} failed to launch; the other hosts were stopped", bad)
        meta = dict(done[0].value[1])
        meta["nodes"] = [r.value[0] for r in done]
        meta["remote_run_path"] = meta["nodes"][0]["remote_run_path"]
        meta["pid"] = meta["nodes"][0]["pid"]
        return meta

    def _node_command(self, node, counts: list[int], ray_dirs: tuple) -> tuple[list[str], Optional[str]]:
        """(argv, shell command or None) of a node's part: torchrun around the job, a Ray node, or the job itself."""
        from . import launchers

        job = core.job_argv(self.script_rel, self.args, node.python,
                            shebang=core.read_shebang(self.project / self.script_rel))
        if self.launcher == "torchrun":
            return launchers.torchrun_argv(job, python=node.python, fleet=self.fleet, rank=node.rank,
                                           nproc_per_node=self.fleet.gpus_per_node), None
        if self.launcher == "ray":
            return job, launchers.ray_command(job, python=node.python, fleet=self.fleet, rank=node.rank,
                                              temp_dirs=ray_dirs, port=self.master_port or launchers.RAY_PORT,
                                              num_gpus=counts[node.rank], join_timeout=self.join_wait)
        return job, None

    def _stop_launched(self, failed: int) -> None:
        from . import scripts as rl

        self.out.warn(f"launch failed on {failed} host(s); stopping the {len(self.launched)} launched")
        for node, run_dir in list(self.launched):
            try:
                rl.stop(self.remotes[node.rank], self.rid, run_dir, 2.0)
            except Exception as exc:  # noqa: BLE001 - keep stopping the others
                self.out.warn(f"host #{node.rank}: stop failed: {getattr(exc, 'message', exc)}")


def _fleet_error(what: str, bad: list, *, last: bool = False):
    """One error for the hosts that failed: `what: host #0 (...): ...; host #1 ...`, or with `last` the hosts first
    and `; what` once at the end (each host's own "; not launching" said once for all: issue #36's "not launched:
    not launching: host #0 ...; not launching")."""
    from .. import hostpool
    from ..errors import GpuopsError

    code = hostpool.worst_code(r.code for r in bad)
    ending = f"; {what}"
    detail = "; ".join(f"host #{r.rank} ({r.host}): {r.message.removesuffix(ending) if last else r.message}"
                       for r in bad)
    hints = [getattr(r.error, "hint", None) for r in bad]
    return GpuopsError(f"{detail}{ending}" if last else f"{what}: {detail}", hint=next((h for h in hints if h), None),
                       code=code)


# -- fleets: the other nodes of a run --------------------------------------------------------------------------------
def fleet_states(prof, out, meta: dict, *, parallel: int = 8) -> list:
    """Each node's RunInfo of a fleet run (None where the host could not be asked), in rank order."""
    return [info for info, _ in node_ends(prof, out, meta, parallel=parallel)]


def node_ends(prof, out, meta: dict, *, project: Optional[Path] = None, parallel: int = 8) -> list:
    """Each node's (RunInfo or None, ending or None), rank order. With `project`: a node whose job ended otherwise
    than with exit 0 is judged (jobs/endings.py) on the facts of its death, gathered in the same execution as its
    state, and its state and ending are kept in runs/<id>/state[.host<N>].json; a node's own playbook is the
    project's."""
    from .. import hostpool
    from . import scripts as rl

    nodes = prof.nodes()
    rid = meta["run_id"]

    def one(node):
        nm = core.node_meta(meta, node.rank)
        remote = connect(node, out)
        try:
            got = rl.query_states(remote, [(rid, nm["remote_run_dir"])], endings=[rid] if project else ())
        finally:
            remote.close()
        info = got["infos"].get(rid)
        if project is None or info is None or not info.exists or info.state not in core.ENDED:
            return info, None
        ending = _endings(got, {}, None, project).get(rid)
        core.save_local_state(rid, info, project, ending=ending, rank=node.rank)
        return info, ending

    got = hostpool.for_each(nodes[:len(meta.get("nodes") or [])], one, parallel=parallel)
    return [r.value if r.value is not None else (None, None) for r in got]


def wait_fleet(prof, out, project: Path, meta: dict, *, interval: float = 2.0,
               sleep: Callable[[float], None] = time.sleep, followed: int = 0,
               json_lines: bool = False) -> tuple[int, dict, list]:
    """After the followed node ended: wait until every node's job has ended; the worst outcome decides. Each other
    node that did not succeed is said with what its job died of (its evidence and fix; `json_lines`, watch --json:
    an `ending` object with its `rank` on stdout). Returns (exit code, {rank: ending} of every node judged, each
    node's RunInfo or None)."""
    said: set[int] = set()
    while True:
        ends = node_ends(prof, out, meta, project=project)
        infos = [info for info, _ in ends]
        running = [i for i, info in enumerate(infos) if info is not None and info.state == core.RUNNING]
        if not running:
            _say_nodes(out, ends, followed, json_lines)
            return core.fleet_exit(infos), {i: e for i, (_, e) in enumerate(ends) if e}, infos
        for i in running:
            if i not in said:
                out.info(f"waiting for host #{i}: its job is still running")
                said.add(i)
        sleep(interval)


def _say_nodes(out, ends: list, followed: int, json_lines: bool) -> None:
    """Each node that did not succeed: its state and exit code, and (a node not followed) what it died of."""
    from .watchtext import ending_doc, ending_lines

    for i, (info, ending) in enumerate(ends):
        if info is not None and info.state == core.SUCCEEDED:
            continue
        state = info.state if info is not None else "unknown (the host could not be asked)"
        code = f" (exit {info.exit_code})" if info is not None and info.exit_code is not None else ""
        out.info(f"host #{i}: {state}{code}" + (f": {ending['title']}" if ending else ""))
        if ending and i != followed:
            if json_lines:
                out.emit_json_line({**ending_doc(ending, time.time()), "rank": i})
            else:
                for line in ending_lines(ending, indent="    ")[1:]:
                    out.info("  " + line)


def tail_all(prof, out, project: Path, meta: dict, lines: int) -> list[tuple[int, str, str]]:
    """The last N lines of every node's log: [(rank, host, text)]."""
    from .. import hostpool
    from . import scripts as rl

    rid = meta["run_id"]

    def one(node):
        nm = core.node_meta(meta, node.rank)
        remote = connect(node, out)
        try:
            info, text = rl.tail(remote, rid, nm["remote_run_dir"], lines)
        finally:
            remote.close()
        if not info.exists:
            raise RemoteError(f"run {rid} not found on host #{node.rank} ({nm['remote_run_dir']})")
        return text

    nodes = prof.nodes()[:len(meta.get("nodes") or [1])]
    got = hostpool.for_each(nodes, one)
    for r in got:
        if r.error:
            out.warn(f"host #{r.rank} ({r.host}): {r.message}")
    return [(r.rank, r.host, r.value) for r in got if r.value is not None]


def stop_fleet(prof, out, project: Path, meta: dict, grace: float) -> dict:
    """Stop a fleet run on every host in parallel."""
    from .. import hostpool

    nodes = prof.nodes()[:len(meta["nodes"])]
    got = hostpool.for_each(nodes, lambda node: stop(node, out, project, core.node_meta(meta, node.rank), grace))
    results = [{"rank": r.rank, "host": r.host, **(r.value or {}), "error": r.message or None} for r in got]
    return {"run_id": meta["run_id"], "hosts": results, "code": hostpool.worst_code(r.code for r in got)}


def status_fleet(prof, out, project: Path, host: Optional[int] = None) -> dict:
    """status on every host (or --host N) in parallel."""
    from .. import hostpool

    nodes = prof.nodes() if host is None else [prof.node(host)]
    got = hostpool.for_each(nodes, lambda node: status(node, out, project))
    return {"profile": prof.name, "hosts": [{"rank": r.rank, "host": r.host, "error": r.message or None,
                                             **(r.value or {})} for r in got],
            "code": hostpool.worst_code(r.code for r in got)}

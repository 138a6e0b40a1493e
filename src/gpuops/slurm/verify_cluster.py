"""`gpuops verify` on a profile with `slurm:`: the login node's one connection -> the cluster's facts (one execution)
-> the probe on every node in ONE srun step (with --bench, then the all-reduce across them in a second) -> verify's
checks per node, the fleet checks across the nodes and the cluster's own lines (partition, node states with Slurm's
reasons, gres, nodes enough, the all-reduce's figure) -> one report and exit code.

Composes slurm/cluster.py (talking), slurm/cluster_checks.py (the cluster's judgement) and verify's own judging
and rendering, unchanged (verify/host.py, verify/checks.py, verify/fleet_checks.py, verify/report.py).
"""
from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Callable, Optional

from ..errors import ExitCode, ProfileError
from ..verify.results import FAIL, INFO, PASS, WARN, CheckResult

DEFAULT_WAIT_S = 20


def run_cluster_verify(profile, out, *, playbook: Optional[str] = None, save: bool = True, cuda_check: bool = True,
                       project_dir: Optional[Path] = None, clock: Callable[[], datetime] = datetime.now,
                       fail_on_warn: bool = False, bench: bool = False, wait_s: int = DEFAULT_WAIT_S) -> int:
    """Verify the cluster behind a Slurm profile; prints the report (or one --json document); returns the exit code."""
    from ..profiles import model as profiles

    project_dir = project_dir or Path.cwd()
    doc, per_node = gather_and_judge(profile, out, playbook=playbook, cuda_check=cuda_check, project_dir=project_dir,
                                     clock=clock, fail_on_warn=fail_on_warn, bench=bench, wait_s=wait_s)
    show(out, doc, per_node)
    if save:
        from ..verify.host import save_report

        for rep, results in per_node:
            save_report(rep, results, project_dir, clock())
        path = save_cluster(doc, project_dir, clock())
        out.step(f"reports saved under {path.parent}")
    profiles.remember(profile, project_dir)
    return doc["code"]


def _judging(profile, playbook, project_dir: Path, cuda_check: bool, bench: bool):
    from .. import knowledge as kb
    from ..verify.host import probe_params, with_optional_checks

    pb = kb.load_playbook("verify", project_dir, path=playbook)
    knowledge, presets = kb.knowledge(project_dir), kb.presets(project_dir)
    knowledge = {**knowledge, "rules": kb.load_playbook("rules", project_dir)}
    pb = with_optional_checks(pb, knowledge["rules"], profile)
    params = probe_params(profile, pb, presets, project_dir, cuda_check=cuda_check, bench=bench)
    params["distributions"] = True  # every package the nodes' python has: what `plan`/`train` judge against
    return pb, knowledge, presets, kb.preset_env(profile.env_preset, project_dir), params


def gather_and_judge(profile, out, *, playbook, cuda_check, project_dir: Path, clock, fail_on_warn: bool,
                     bench: bool, wait_s: int):
    """(the cluster's document, [(node report, node results)]): everything but the showing."""
    from ..remote.connection import connect
    from ..remote.gather import probe_source
    from ..remote.shell import shell_path
    from . import cluster, cluster_checks
    from .probe_step import StepSpec

    settings = profile.slurm
    pb, knowledge, presets, preset_env, params = _judging(profile, playbook, project_dir, cuda_check, bench)
    started = time.monotonic()
    with out.status(f"connecting to the login node {profile.user}@{profile.host}:{profile.port}"):
        remote = connect(profile, announce=out.info)
    step, busy, limit, allreduce = None, None, _limit_s(params), None
    try:
        with out.status("reading the cluster (sinfo, scontrol)"):
            login = cluster.login_facts(remote)
        plan = cluster_checks.resolve(settings, login.nodes, login.partitions, login.assoc, login.groups)
        if plan.problems:
            raise ProfileError(_problems_text(profile, plan.problems),
                               hint=f"fix `slurm:` in {profile.source or 'the profile'} (partitions: "
                                    f"{', '.join(plan.available) or 'none'})")
        cluster_results = cluster_checks.node_results(settings, plan)
        if plan.step_nodes:
            keep_off = list(settings.exclude) + [n.name for n in plan.partition.nodes if not n.usable
                                                  and n.name not in settings.exclude]
            spec = StepSpec(nodes=plan.step_nodes, partition=plan.partition.name, account=settings.account,
                            qos=settings.qos, exclude=keep_off, gpus_per_node=settings.gpus_per_node,
                            gpu_type=settings.gpu_type, gpu_option=settings.gpu_option, wait_s=wait_s, limit_s=limit,
                            nodelist=[n.name for n in plan.usable] if settings.nodelist else [])
            with out.status(f"probing {spec.nodes} node(s) in one srun step"):
                step = cluster.probe_nodes(remote, spec, folder=shell_path(profile.remote_dir_for(project_dir)),
                                           python=profile.python, probe_source=probe_source(params))
            from .probe_step import nodes_busy

            if nodes_busy(step):
                busy = cluster.why_busy(remote, step.job_id, plan.partition.name)
            cluster_results += step_results(step, plan, settings, wait_s, busy)
            if bench:
                allreduce = run_allreduce(remote, out, step, spec, profile, project_dir)
        executions = remote.exec_count
    finally:
        remote.close()
    per_node = judge_nodes(profile, step, pb, knowledge, presets, preset_env, executions, clock)
    cluster_results += allreduce_results(allreduce, step, per_node, project_dir)
    from ..verify import fleet_checks

    reports = [rep for rep, _ in per_node]
    fleet = fleet_checks.compare(reports) if len(reports) > 1 else []
    fleet = [_named(r, reports) for r in fleet]
    doc = cluster_document(profile, login, plan, step, cluster_results, per_node, fleet, executions,
                           time.monotonic() - started, clock(), fail_on_warn, allreduce=allreduce)
    return doc, per_node


def _limit_s(params: dict) -> int:
    """The step's time: the probe's slowest fact (the CUDA test, the bench) and a margin."""
    t = params.get("timeouts") or {}
    worst = max([90] + [int(v) for v in t.values() if isinstance(v, (int, float))])
    return worst + (int(t.get("bench", 180)) if params.get("bench") else 0) + 60


def run_allreduce(remote, out, step, spec, profile, project_dir: Path):
    """--bench with 2 nodes or more whose probe answered: the all-reduce across them, a second srun step over those
    nodes (slurm/allreduce_step.py). None (no step) otherwise."""
    from dataclasses import replace

    from ..remote.shell import shell_path
    from . import cluster
    from .allreduce_step import LIMIT_S, worker_source

    ok = [n for n in step.nodes if n in step.docs]
    if len(ok) < 2:
        return None
    ar_spec = replace(spec, nodes=len(ok), nodelist=ok, exclude=[], limit_s=LIMIT_S)
    with out.status(f"all-reduce across {len(ok)} nodes ({', '.join(ok)}) in a second srun step"):
        return cluster.allreduce_nodes(remote, ar_spec, folder=shell_path(profile.remote_dir_for(project_dir)),
                                       python=profile.python, worker=worker_source())


def allreduce_results(allreduce, step, per_node: list, project_dir: Path) -> list[CheckResult]:
    """The all-reduce's lines (allreduce_step.judge_run): the GPU's name and GPUs per node from the node reports, the
    InfiniBand facts of a node that has IB ports (else the first node's) for NCCL's transport."""
    if allreduce is None:
        return []
    from ..verify import checks_ib, facts_ib
    from .allreduce_step import judge_run

    nodes = allreduce.nodes or [rep["host"] for rep, _ in per_node]
    ibs = [facts_ib.from_probe(json.loads(step.docs[n])) for n in nodes if n in step.docs]
    ib = next((i for i in ibs if i.ib_ports), ibs[0] if ibs else None)
    gpus = next((rep["facts"]["gpus"] for rep, _ in per_node if (rep.get("facts") or {}).get("gpus")), [])
    return judge_run(allreduce, ib=ib, reference=checks_ib.load_reference(project_dir),
                     gpu_name=gpus[0].get("name") if gpus else None, gpus_per_node=len(gpus) or None)


def _problems_text(profile, problems: list[str]) -> str:
    if len(problems) == 1:
        return f"profile '{profile.name}': {problems[0]}"
    return f"profile '{profile.name}': " + "; ".join(problems)


def step_results(step, plan, settings, wait_s: int, busy) -> list[CheckResult]:
    """The step's own line: did Slurm give the nodes at once, did every node answer."""
    from .cluster_checks import unused_nodes
    from .probe_step import allocation_failed

    failed = allocation_failed(step)
    if failed is None:
        out = [CheckResult("slurm.step", "probe step (srun)", PASS,
                           measured=f"{len(step.nodes)} node(s) in one step: {', '.join(step.nodes)}")]
        left = unused_nodes(plan, step.nodes)
        if left:
            out.append(CheckResult("slurm.unverified", "usable nodes not probed", INFO,
                                   measured=f"{', '.join(left)}: the job asks {plan.nodes_asked} node(s) and Slurm "
                                            f"chose {', '.join(step.nodes)}; slurm.nodes: {len(plan.usable)} (or "
                                            f"slurm.nodelist) probes them too"))
        return out
    if busy is not None:
        job, holders = busy
        reason = ""
        if job is not None and job.reason:
            from .reasons import explain_pending, load_reasons

            try:
                reason = explain_pending(job, load_reasons(), partition=plan.partition.name, now=time.time()).line()
            except Exception:  # noqa: BLE001 - the reasons table is knowledge; Slurm's code alone still says it
                reason = f"pending ({job.reason})"
        held = "; ".join(holders[:5])
        return [CheckResult(
            "slurm.step", "probe step (srun)", FAIL,
            measured=f"partition {plan.partition.name} has no {plan.step_nodes} free node(s) within {wait_s} s: "
                     f"{failed}" + (f"; the step's job was {reason}" if reason else ""),
            detail=f"squeue (job|user|state|nodes|where): {held}" if held else None,
            remediation="no node was verified: run verify again when the partition has free nodes "
                        "(--alloc-wait SECONDS waits longer), or verify fewer nodes (slurm.nodes)")]
    return [CheckResult("slurm.step", "probe step (srun)", FAIL, measured=f"Slurm refused the step: {failed}",
                        remediation="see the partition, gres and account lines above; `srun` says the same on the "
                                    "login node")]


def judge_nodes(profile, step, pb, knowledge, presets, preset_env, executions, clock) -> list:
    """Each node's probe document through verify's checks, unchanged: [(report, results)] in the step's order."""
    from ..verify.checks import evaluate
    from ..verify.facts import from_probe
    from ..verify.host import build_report

    out = []
    if step is None:
        return out
    for rank, node in enumerate(step.nodes):
        text = step.docs.get(node)
        if text is None:
            out.append((no_report(profile, node, rank, step, clock()), []))
            continue
        raw = json.loads(text)
        facts = from_probe(raw, host=node, failures=knowledge.get("nvidia_smi_failures", []))
        results = evaluate(facts, profile, pb, knowledge, presets, preset_env)
        results += ib_results(raw, facts, multi_node=len(step.nodes) > 1, have=results)
        rep = build_report(profile, facts, results, 1, float((raw.get("seconds") or 0)), clock())
        rep.update(host=node, node=rank, slurm_node=node)
        out.append((rep, results))
    return out


def ib_results(raw: dict, facts, *, multi_node: bool, have: list) -> list:
    """InfiniBand, GPUDirect and NCCL's variables (verify/checks_ib.py's judge) per node, when that family exists
    and verify's own checks did not judge them already."""
    if any(r.id.startswith("network.") for r in have):
        return []
    try:
        from ..verify import checks_ib, facts_ib
    except ImportError:  # pragma: no cover - the family is younger than this module
        return []
    gpus = getattr(facts, "gpus", None) or []
    return list(checks_ib.judge(facts_ib.from_probe(raw), multi_node=multi_node,
                                gpu_name=gpus[0].name if gpus else None, gpus_per_node=len(gpus) or None))


def no_report(profile, node: str, rank: int, step, when: datetime) -> dict:
    """A node whose task gave no document: what its task said (stderr), and why that usually is."""
    said = step.task_errors.get(node) or []
    last = next((ln for ln in reversed(said) if ln.strip()), "no output")
    fix = "see the node's words above"
    if "No such file" in last or "can't open file" in last:
        fix = ("the probe written on the login node is not there on the node: set remote_dir: to a folder on the "
               "filesystem the login node and the nodes share")
    elif "not found" in last:
        fix = f"the profile's python ({profile.python}) is not on the node: set python: to one every node has"
    res = CheckResult("system.probe", f"probe on {node}", FAIL, measured=f"no report ({last})", remediation=fix,
                      detail="; ".join(said[-5:]) or None)
    return {"profile": profile.name, "host": node, "user": profile.user, "port": profile.port, "node": rank,
            "slurm_node": node, "checked_at": when.astimezone().isoformat(timespec="seconds"), "verdict": FAIL,
            "summary": {"pass": 0, "warn": 0, "fail": 1, "info": 0}, "remote_executions": 1, "duration_s": 0.0,
            "emulated": False, "checks": [res.to_dict()], "facts": {}, "error": f"{node}: no report: {last}"}


def _named(result: CheckResult, reports: list) -> CheckResult:
    """A fleet check's `#0, #2` in the nodes' names (n1, n3): a cluster's nodes are known by name."""
    import re

    result.title = result.title.replace("every host", "every node")
    if result.status == PASS or not result.measured:
        return result
    names = {str(r.get("node")): r.get("slurm_node") for r in reports}
    result.measured = re.sub(r"#(\d+)", lambda m: names.get(m.group(1)) or m.group(0), result.measured)
    result.remediation = ("make every node match (the cluster's image, or keep the odd node out with slurm.exclude): "
                          "a mixed allocation fails or slows in collective operations")
    return result


def cluster_document(profile, login, plan, step, cluster_results, per_node, fleet, executions, seconds, when,
                     fail_on_warn: bool, allreduce=None) -> dict:
    """verify's --json for a cluster: the cluster's own report (its checks, verdict, summary, as one host's), the
    nodes as `hosts` (a fleet's shape: rank, host, code, error, report) and the fleet checks across them."""
    from ..verify.checks import verdict
    from ..verify.host import exit_code

    from .. import hostpool

    counts = {s: sum(1 for r in cluster_results if r.status == s) for s in (PASS, WARN, FAIL, INFO)}
    cluster_verdict = verdict(cluster_results) if cluster_results else PASS
    fleet_verdict = verdict(fleet) if fleet else PASS
    hosts = [{"rank": rank, "host": rep["host"], "code": exit_code(rep, fail_on_warn), "seconds": rep["duration_s"],
              "error": rep.get("error"), "report": rep} for rank, (rep, _) in enumerate(per_node)]
    codes = [h["code"] for h in hosts] + [
        int(ExitCode.FAILED) if cluster_verdict == FAIL or (fail_on_warn and cluster_verdict == WARN) else 0,
        int(ExitCode.FAILED) if fleet_verdict == FAIL or (fail_on_warn and fleet_verdict == WARN) else 0]
    worst = verdict(list(cluster_results) + list(fleet) + [CheckResult("x", "x", h["report"]["verdict"])
                                                          for h in hosts])
    part = plan.partition
    doc = {
        "profile": profile.name, "host": profile.host, "user": profile.user, "port": profile.port,
        "checked_at": when.astimezone().isoformat(timespec="seconds"), "verdict": worst, "summary": counts,
        "remote_executions": executions,
        "srun_steps": (1 if step is not None else 0) + (1 if allreduce is not None else 0),
        "duration_s": round(seconds, 3), "emulated": any(rep.get("emulated") for rep, _ in per_node),
        "checks": [r.to_dict() for r in cluster_results],
        "slurm": {"version": login.version, "partition": part.name if part else None,
                  "nodes_asked": plan.nodes_asked, "nodes_verified": [rep["host"] for rep, _ in per_node],
                  "job_id": step.job_id if step else None,
                  "nodes": [{"name": n.name, "state": n.state, "flags": list(n.flags), "gres": n.gres,
                             "gpus": n.gpus, "reason": n.reason, "reason_user": n.reason_user,
                             "reason_time": n.reason_time, "usable": n.usable} for n in (part.nodes if part else [])],
                  "verdict": cluster_verdict},
        "hosts": hosts, "fleet": {"verdict": fleet_verdict, "checks": [x.to_dict() for x in fleet]},
        "failed_nodes": failed_nodes(hosts),
        "code": hostpool.worst_code(codes), "facts": {},
    }
    if allreduce is not None:  # --bench across 2 nodes or more: what the second srun step measured
        doc["allreduce"] = allreduce.to_dict()
    return doc


def failed_nodes(hosts: list[dict]) -> list[dict]:
    """Each node whose own checks failed: its failed checks' titles and the fix that keeps a job off it."""
    from .cluster_checks import exclude_fix

    out = []
    for h in hosts:
        if h["report"].get("verdict") != FAIL:
            continue
        failed = [c["title"] for c in h["report"].get("checks") or [] if c.get("status") == FAIL]
        out.append({"node": h["host"], "failed": failed, "fix": exclude_fix(h["host"]) + ", until the node's own "
                    "fix above is done (your cluster's admins: drain it with that reason)"})
    return out


def show(out, doc: dict, per_node: list) -> None:
    """The cluster's lines, each node's report (verify's own rendering), the fleet checks, one summary line."""
    if out.json_mode:
        out.emit_json(doc)
        return
    from ..verify.host import show as show_one
    from .report_text import cluster_lines, fleet_lines, summary_line

    for line in cluster_lines(doc):
        out.print(line)
    for rep, results in per_node:
        out.print()
        out.print(f"=== node {rep['host']} ===")
        if results:
            show_one(out, rep, results)
        else:
            out.error(rep.get("error") or f"{rep['host']}: no report",
                      (rep["checks"][0].get("remediation") if rep.get("checks") else None))
    out.print()
    for line in fleet_lines(doc):
        out.print(line)
    out.print(summary_line(doc))


def save_cluster(doc: dict, project_dir: Path, when: datetime) -> Path:
    """logs/env_checks/<date>_<profile>-cluster.json and .txt: the cluster's document and its lines."""
    from ..paths import write_atomic
    from .report_text import cluster_lines, fleet_lines, summary_line

    base = project_dir / "logs" / "env_checks" / f"{when.strftime('%Y-%m-%d_%H%M%S')}_{doc['profile']}-cluster"
    write_atomic(base.with_suffix(".json"), json.dumps(doc, indent=2, default=str) + "\n")
    write_atomic(base.with_suffix(".txt"), "\n".join(cluster_lines(doc) + fleet_lines(doc) + [summary_line(doc)])
                 + "\n")
    return base.with_suffix(".json")

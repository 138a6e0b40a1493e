"""`gpuops verify`: profile -> one connection -> one probe execution -> pure checks -> report -> exit code."""
from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from .. import knowledge as kb
from .checks import FAIL, WARN, evaluate, verdict
from ..errors import ExitCode
from .facts import from_probe

BASE_PACKAGES = ["torch", "torchvision", "torchaudio", "vllm", "flash-attn", "transformers", "numpy"]


BENCH_PARAMS = {"seconds": 1.0, "matmul_n": 8192, "copy_mib": 1024, "allreduce": True, "allreduce_mib": 256}


def probe_params(profile, playbook: dict, presets: dict, project_dir: Path, *, cuda_check: bool = True,
                 bench: bool = False) -> dict:
    checks = playbook.get("checks") or []
    env_names = {"CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_CUDA_ARCH_LIST"}
    for c in presets.get("conflicts", []) or []:
        env_names.update((c.get("when", {}).get("env") or {}).keys())
    return {
        "remote_dir": profile.remote_dir_for(project_dir),
        "packages": sorted(set(BASE_PACKAGES) | set(profile.expect.packages) | set(playbook.get("rule_packages") or [])),
        "imports": list(profile.expect.imports),
        "auto_imports": playbook.get("auto_imports") or {},
        "env": sorted(env_names),
        "cuda_check": cuda_check,
        "timeouts": playbook.get("timeouts") or {},
        "user_checks": [{"name": u["name"], "command": u["command"], "timeout": u.get("timeout", 30)}
                        for u in playbook.get("user_checks") or []],
        "health": not checks or "gpu.health_fields" in checks,
        "kernel_log": not checks or "gpu.kernel_log" in checks,
        **({"bench": dict(BENCH_PARAMS)} if bench else {}),
    }


def with_optional_checks(pb: dict, rules: dict, profile) -> dict:
    """The playbook with the profile's opt-in checks (`checks: [vllm, apex]`, playbooks/rules.yaml) added to its
    user_checks: they run in the same round trip. The rules' packages are measured too."""
    from .rules import optional_user_checks, rule_packages

    extra = optional_user_checks(rules, list(getattr(profile, "checks", []) or []), profile.python,
                                 profile.expect.packages.get("torch"))
    return {**pb, "user_checks": list(pb.get("user_checks") or []) + extra, "rule_packages": rule_packages(rules)}


def run_verify(profile, out, *, playbook: str | None = None, save: bool = True, cuda_check: bool = True,
               project_dir: Path | None = None, clock: Callable[[], datetime] = datetime.now,
               fail_on_warn: bool = False, retry_802_s: float = 0.0, sleep: Callable[[float], None] = time.sleep,
               bench: bool = False) -> int:
    from ..profiles import model as profiles

    project_dir = project_dir or Path.cwd()
    report, results = check_host(profile, out, playbook=playbook, cuda_check=cuda_check, project_dir=project_dir,
                                 clock=clock, retry_802_s=retry_802_s, sleep=sleep, bench=bench)
    show(out, report, results)
    if save:
        saved = save_report(report, results, project_dir, clock())
        out.step(f"report saved: {saved[0]} and .txt")
    profiles.remember(profile, project_dir)
    return exit_code(report, fail_on_warn)


def exit_code(report: dict, fail_on_warn: bool = False) -> int:
    failed = report["verdict"] == FAIL or (fail_on_warn and report["verdict"] == WARN)
    return int(ExitCode.FAILED) if failed else int(ExitCode.OK)


def check_host(profile, out, *, playbook: str | None = None, cuda_check: bool = True, project_dir: Path,
               clock: Callable[[], datetime] = datetime.now, extra_params: dict | None = None,
               retry_802_s: float = 0.0, sleep: Callable[[float], None] = time.sleep, bench: bool = False):
    """One host: connect, gather (one execution), judge. Returns (report, results); shows nothing.
    retry_802_s: on a fresh cloud instance, CUDA error 802 (system not yet initialized: fabric manager still
    starting) is transient; gather again every 15 s for up to that long before reporting it."""
    from ..remote.connection import connect
    from ..remote.gather import gather

    pb = kb.load_playbook("verify", project_dir, path=playbook)
    knowledge, presets = kb.knowledge(project_dir), kb.presets(project_dir)
    preset_env = kb.preset_env(profile.env_preset, project_dir)
    knowledge = {**knowledge, "rules": kb.load_playbook("rules", project_dir)}
    pb = with_optional_checks(pb, knowledge["rules"], profile)
    params = {**probe_params(profile, pb, presets, project_dir, cuda_check=cuda_check, bench=bench),
              **(extra_params or {})}
    started = time.monotonic()
    with out.status(f"connecting to {profile.user}@{profile.host}:{profile.port}"):
        remote = connect(profile, announce=out.info)
    retry_until = time.monotonic() + retry_802_s
    _warm_judging()
    try:
        while True:
            with out.status("gathering facts (one remote execution)" + (", with the GPU bench" if params.get("bench")
                                                                         else "")):
                doc = gather(remote, params, python=profile.python)
            facts = from_probe(doc, host=profile.host, failures=knowledge.get("nvidia_smi_failures", []))
            results = evaluate(facts, profile, pb, knowledge, presets, preset_env)
            if not (cuda_error_802(results) and time.monotonic() < retry_until):
                break
            out.step("CUDA error 802 (system not yet initialized): the GPUs are still starting; trying again in 15 s")
            sleep(15.0)
        executions = remote.exec_count
    finally:
        remote.close()
    report = build_report(profile, facts, results, executions, time.monotonic() - started, clock())
    if "reach" in doc:
        report["reach"] = doc["reach"]
    if facts.bench is not None:
        report["bench"] = facts.bench
    return report, results


def _warm_judging() -> None:
    """Import what judging needs first (packaging's version rules: ~35 ms) in the background while the host works,
    instead of after the facts are in. Judging imports it again if this failed; a module half-imported here is
    waited for by the import system."""
    import threading

    def load() -> None:
        try:
            import packaging.specifiers  # noqa: F401
            import packaging.version  # noqa: F401
        except Exception:  # pragma: no cover - judging will say what is wrong
            pass

    threading.Thread(target=load, name="gpuops-warm-judging", daemon=True).start()


def cuda_error_802(results) -> bool:
    """Lambda's transient 'system not yet initialized' on a fresh NVSwitch instance."""
    return any(r.id == "cuda.runtime" and r.status == FAIL and ("802" in (r.detail or "") or
               "not yet initialized" in (r.detail or "")) for r in results)


def build_report(profile, facts, results, executions: int, seconds: float, when: datetime) -> dict:
    counts = {s: sum(1 for r in results if r.status == s) for s in ("pass", "warn", "fail", "info")}
    return {
        "profile": profile.name, "host": profile.host, "user": profile.user, "port": profile.port,
        "region": profile.region, "instance_type": profile.instance_type,
        "checked_at": when.astimezone().isoformat(timespec="seconds"), "verdict": verdict(results), "summary": counts,
        "remote_executions": executions, "duration_s": round(seconds, 3), "emulated": facts.emulated,
        "checks": [r.to_dict() for r in results], "facts": facts.to_dict(),
    }


def show(out, report: dict, results) -> None:
    from .report import plain_lines, render_rich

    if out.json_mode:
        out.emit_json(report)
    elif out.rich:
        render_rich(out, report, results)
    else:
        for line in plain_lines(report, results):
            out.print(line)


def save_report(report: dict, results, project_dir: Path, when: datetime) -> tuple[Path, Path]:
    """logs/env_checks/<date>_<profile>.json and .txt, as the Stage 2 runbook asks (seeds/000); a fleet's hosts
    each get their own (<profile>-host<N>)."""
    from ..paths import write_atomic
    from .report import plain_lines

    name = report["profile"] + (f"-host{report['node']}" if report.get("node") is not None else "")
    base = project_dir / "logs" / "env_checks" / f"{when.strftime('%Y-%m-%d_%H%M%S')}_{name}"
    jpath, tpath = base.with_suffix(".json"), base.with_suffix(".txt")
    write_atomic(jpath, json.dumps(report, indent=2, default=str) + "\n")
    write_atomic(tpath, "\n".join(plain_lines(report, results)) + "\n")
    return jpath, tpath


def run_fleet_verify(profile, out, *, playbook: str | None = None, save: bool = True, cuda_check: bool = True,
                     project_dir: Path | None = None, clock: Callable[[], datetime] = datetime.now,
                     fail_on_warn: bool = False, parallel: int | None = None, bench: bool = False,
                     retry_802_s: float = 0.0) -> int:
    """Every host of a fleet profile at once (one connection and one probe execution each; up to hostpool.WIDE_PARALLEL
    at a time), a section per host in rank order, then the fleet as a whole: the same stack everywhere, and every
    node reaching rank 0's rendezvous address. A host's section and saved report are made as soon as its result
    arrives, while the others still work; only the printing waits for the rank order.
    Exit: the worst host's, or 1 when the fleet checks fail."""
    from .. import hostpool
    from ..hostpool import MASTER_PORT
    from ..profiles import model as profiles
    from . import fleet_checks

    project_dir = project_dir or Path.cwd()
    nodes = profile.nodes()
    master = nodes[0].address
    started = time.monotonic()

    def one(node):
        buf = hostpool.Buffered(json_mode=out.json_mode, debug=out.debug)
        extra = {"reach": {"host": master, "port": MASTER_PORT, "timeout": 5}} if node.rank else None
        rep, results = check_host(node, buf.output, playbook=playbook, cuda_check=cuda_check, project_dir=project_dir,
                                  clock=clock, extra_params=extra, bench=bench, retry_802_s=retry_802_s)
        rep["node"] = node.rank
        if not out.json_mode:  # --json: the one document below carries every report
            show(buf.output, rep, results)
        if save:
            save_report(rep, results, project_dir, clock())
        return rep, results, buf

    with out.status(f"verifying {len(nodes)} hosts in parallel"):
        got = hostpool.for_each(nodes, one, parallel=parallel or min(len(nodes), hostpool.WIDE_PARALLEL),
                                code_of=lambda v: exit_code(v[0], fail_on_warn))
    reports = [r.value[0] if r.value else None for r in got]
    fleet_results = fleet_checks.compare(reports) + fleet_checks.reach_results(reports, master, MASTER_PORT)
    fleet_verdict = verdict(fleet_results) if fleet_results else "pass"
    codes = [r.code for r in got] + [int(ExitCode.FAILED) if fleet_verdict == FAIL else 0]
    code = hostpool.worst_code(codes)
    seconds = round(time.monotonic() - started, 3)
    if out.json_mode:
        out.emit_json({"profile": profile.name, "hosts": [
            {**r.to_json(), "report": r.value[0] if r.value else None} for r in got],
            "fleet": {"verdict": fleet_verdict, "checks": [x.to_dict() for x in fleet_results]},
            "code": code, "duration_s": seconds})
    for node, r in zip(nodes, got):
        if not out.json_mode:
            out.print(f"=== host #{node.rank}: {node.user}@{node.host}:{node.port} ===")
        if r.value:
            r.value[2].replay(out)
        else:
            out.error(f"host #{node.rank} ({node.host}): {r.message}", getattr(r.error, "hint", None))
        if not out.json_mode:
            out.print()
    if not out.json_mode:
        out.print(f"=== fleet: {len(nodes)} hosts ===")
        for x in fleet_results:
            line = f"  {x.status.upper():4}  {x.title}: {x.measured or '-'}"
            out.print(line)
            if x.remediation and x.status != "pass":
                out.print(f"        fix: {x.remediation}")
        ok = sum(1 for r in got if r.code == 0)
        out.print(f"{'PASS' if code == 0 else 'FAIL'}: {profile.name} — {ok}/{len(nodes)} hosts passed, fleet checks "
                  f"{fleet_verdict} — {seconds:.1f}s")
    if all(r.value for r in got):
        profiles.remember(profile, project_dir)
    return code

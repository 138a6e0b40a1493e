"""`gpuops verify`: profile -> one connection -> one probe execution -> pure checks -> report -> exit code."""
from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from . import knowledge as kb
from .checks import FAIL, WARN, evaluate, verdict
from .errors import ExitCode
from .facts import from_probe

BASE_PACKAGES = ["torch", "torchvision", "torchaudio", "vllm", "flash-attn", "transformers", "numpy"]


def probe_params(profile, playbook: dict, presets: dict, project_dir: Path, *, cuda_check: bool = True) -> dict:
    env_names = {"CUDA_VISIBLE_DEVICES", "PYTORCH_CUDA_ALLOC_CONF"}
    for c in presets.get("conflicts", []) or []:
        env_names.update((c.get("when", {}).get("env") or {}).keys())
    return {
        "remote_dir": profile.remote_dir_for(project_dir),
        "packages": sorted(set(BASE_PACKAGES) | set(profile.expect.packages)),
        "imports": list(profile.expect.imports),
        "auto_imports": playbook.get("auto_imports") or {},
        "env": sorted(env_names),
        "cuda_check": cuda_check,
        "timeouts": playbook.get("timeouts") or {},
        "user_checks": [{"name": u["name"], "command": u["command"], "timeout": u.get("timeout", 30)}
                        for u in playbook.get("user_checks") or []],
    }


def run_verify(profile, out, *, playbook: str | None = None, save: bool = True, cuda_check: bool = True,
               project_dir: Path | None = None, clock: Callable[[], datetime] = datetime.now,
               fail_on_warn: bool = False) -> int:
    from . import profiles
    from .remote.connection import connect
    from .remote.gather import gather

    project_dir = project_dir or Path.cwd()
    pb = kb.load_playbook("verify", project_dir, path=playbook)
    knowledge, presets = kb.knowledge(project_dir), kb.presets(project_dir)
    preset_env = kb.preset_env(profile.env_preset, project_dir)
    params = probe_params(profile, pb, presets, project_dir, cuda_check=cuda_check)
    started = time.monotonic()
    with out.status(f"connecting to {profile.user}@{profile.host}:{profile.port}"):
        remote = connect(profile, announce=out.info)
    try:
        with out.status("gathering facts (one remote execution)"):
            doc = gather(remote, params, python=profile.python)
        executions = remote.exec_count
    finally:
        remote.close()
    facts = from_probe(doc, host=profile.host, failures=knowledge.get("nvidia_smi_failures", []))
    results = evaluate(facts, profile, pb, knowledge, presets, preset_env)
    report = build_report(profile, facts, results, executions, time.monotonic() - started, clock())
    show(out, report, results)
    if save:
        saved = save_report(report, results, project_dir, clock())
        out.step(f"report saved: {saved[0]} and .txt")
    profiles.remember(profile, project_dir)
    failed = report["verdict"] == FAIL or (fail_on_warn and report["verdict"] == WARN)
    return int(ExitCode.FAILED) if failed else int(ExitCode.OK)


def build_report(profile, facts, results, executions: int, seconds: float, when: datetime) -> dict:
    counts = {s: sum(1 for r in results if r.status == s) for s in ("pass", "warn", "fail", "info")}
    return {
        "profile": profile.name, "host": profile.host, "user": profile.user, "port": profile.port,
        "region": profile.region, "instance_type": profile.instance_type,
        "time": when.isoformat(timespec="seconds"), "verdict": verdict(results), "summary": counts,
        "remote_executions": executions, "seconds": round(seconds, 3), "emulated": facts.emulated,
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
    """logs/env_checks/<date>_<profile>.json and .txt, as the Stage 2 runbook asks (seeds/000)."""
    from .paths import write_atomic
    from .report import plain_lines

    base = project_dir / "logs" / "env_checks" / f"{when.strftime('%Y-%m-%d_%H%M%S')}_{report['profile']}"
    jpath, tpath = base.with_suffix(".json"), base.with_suffix(".txt")
    write_atomic(jpath, json.dumps(report, indent=2, default=str) + "\n")
    write_atomic(tpath, "\n".join(plain_lines(report, results)) + "\n")
    return jpath, tpath

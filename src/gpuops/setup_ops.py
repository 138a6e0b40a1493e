"""`gpuops setup`, step by step on one SSH connection: gather the host's facts (ONE execution), plan (pure,
setup_plan.py), start the plan's script detached, stream its log, then verify. A setup already running on the host is
re-attached instead; a host that already matches is left alone after that one execution.
Nothing here prints a report: cli/setup.py renders what these functions return."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from . import setup_plan as sp
from .errors import ChecksFailed, ConnectError


def _packages(prof) -> list[str]:
    names = set(sp.TORCH_FAMILY) | {"flash-attn", "uv"} | set(prof.expect.packages)
    return sorted(names)


def _flash_expected(prof) -> bool:
    return any(n in prof.expect.packages for n in sp.FLASH) or "flash_attn" in prof.expect.imports


def setup(prof, out, project: Path, *, dry_run: bool = False, verify: bool = True,
          on_plan: Optional[Callable[[sp.Plan], None]] = None) -> dict:
    """Returns {"plan", "attached", "ran", "rc", "executions", "verify": report or None}."""
    from . import knowledge as kb
    from .remote import setup as rs
    from .remote.connection import connect

    sp.env_dir_of(prof.python)  # a profile error before connecting
    remote_dir = prof.remote_dir_for(project)
    setup_dir = rs.setup_dir_of(remote_dir)
    knowledge = kb.knowledge(project)
    doc: dict = {"profile": prof.name, "remote_dir": remote_dir, "setup_dir": setup_dir, "plan": None,
                 "attached": False, "ran": False, "rc": None, "verify": None}
    remote = connect(prof, announce=out.info)
    try:
        with out.status("gathering the host's facts (one remote execution)"):
            facts = rs.gather(remote, remote_dir, prof.python, _packages(prof), _flash_expected(prof))
        if facts.running:
            doc["attached"] = True
            if dry_run:
                doc["executions"] = remote.exec_count
                out.warn(f"a setup is running on {prof.name} now; `gpuops setup` (without --dry-run) re-attaches")
                return doc
            out.step(f"a setup is already running on {prof.name}: re-attaching to its log ({setup_dir}/log)")
        else:
            plan = sp.make_plan(facts, prof, knowledge, remote_dir=remote_dir)
            doc["plan"] = plan.to_dict()
            if on_plan:
                on_plan(plan)
            if plan.nothing_to_do or dry_run:
                doc["executions"] = remote.exec_count
                return doc
            rs.start(remote, remote_dir=remote_dir, script=sp.render_script(plan, setup_dir=setup_dir),
                     plan_doc=plan.to_dict())
            doc["ran"] = True
        doc["rc"], doc["failed_step"] = _stream(remote, out, remote_dir, prof)
        doc["executions"] = remote.exec_count
    finally:
        remote.close()
    if doc["rc"] != 0:
        raise ChecksFailed(f"setup failed on {prof.name}" + (f" at step {doc.get('failed_step')}"
                                                              if doc.get("failed_step") else "")
                           + f" (exit {doc['rc']})",
                           hint=f"the whole log is {setup_dir}/log on the host; fix the cause, then run "
                                "`gpuops setup` again (finished steps are not repeated)")
    if verify:
        from .verify import check_host

        out.step("verify")
        report, results = check_host(prof, out, project_dir=project)
        doc["verify"] = report
        doc["verify_results"] = results
    return doc


def _stream(remote, out, remote_dir: str, prof) -> tuple[int, Optional[str]]:
    """Show the setup log as it grows, until setup.sh ends; its exit code. A lost connection leaves it running."""
    from .remote import setup as rs

    rc: Optional[int] = None
    failed: Optional[str] = None
    try:
        for line in rs.attach(remote, remote_dir):
            code = rs.exit_of(line)
            if code is not None:
                rc = code
            elif line.startswith("@@step "):
                out.step(line[len("@@step "):])
            elif line.startswith("@@failed "):
                failed = line.split()[1]
                out.warn(f"step {line.split()[1]} failed (exit {line.split()[-1]})")
            elif line == "@@done":
                out.success("every step done")
            else:
                out.info("  " + line)
    except ConnectError as exc:
        raise ConnectError(f"{exc.message}; setup goes on running on the host",
                           hint="run `gpuops setup` again to re-attach to it") from exc
    if rc is None:
        raise ConnectError(f"the setup log stream from {prof.host} ended early; setup goes on running on the host",
                           hint="run `gpuops setup` again to re-attach to it")
    return rc, failed

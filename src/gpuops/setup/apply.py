"""`gpuops setup`, step by step on one SSH connection: gather the host's facts (ONE execution), plan (pure,
setup/plan.py), start the plan's script detached, stream its log, then verify. A setup already running on the host is
re-attached instead; a host that already matches is left alone after that one execution.
Nothing here prints a report: cli/setup.py renders what these functions return."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Callable, Optional

from . import plan as sp
from ..errors import ChecksFailed, ConnectError, GpuopsError


def _packages(prof) -> list[str]:
    names = set(sp.TORCH_FAMILY) | {"flash-attn", "uv"} | set(prof.expect.packages)
    return sorted(names)


def _flash_expected(prof) -> bool:
    return any(n in prof.expect.packages for n in sp.FLASH) or "flash_attn" in prof.expect.imports


def with_environment(prof):
    """The profile as setup acts on it: one that names no python: gets setup's own environment
    (setup_plan.DEFAULT_ENV_PYTHON), made with the system's packages visible. Returns (profile, adopted)."""
    if "python" in prof.model_fields_set or any(h.python for h in prof.hosts):
        return prof, False
    return prof.model_copy(update={"python": sp.DEFAULT_ENV_PYTHON}), True


def _sandbox_hint(prof) -> Optional[str]:
    """The fix for a system python in a profile `gpuops sandbox up` wrote: that command, not the file it rewrites."""
    src = prof.source
    try:
        head = Path(src).read_text()[:200] if src else ""
    except OSError:
        return None
    if "Written by `gpuops sandbox up`" not in head:
        return None
    return (f"`gpuops sandbox up` rewrites this profile each time: run it without --python (its profile then names "
            f"no python:, and setup makes {sp.DEFAULT_ENV_PYTHON} and records it), or with --python "
            f"{sp.DEFAULT_ENV_PYTHON}")


def record_environment(prof, out) -> None:
    """Write `python: <setup's environment>` into the profile file that named none, so train and verify use it."""
    import re as _re

    from ..paths import write_atomic

    src = prof.source
    if src is None or not Path(src).is_file():
        return
    text = Path(src).read_text()
    if _re.search(r"(?m)^python:", text):
        return
    try:
        write_atomic(Path(src), text.rstrip("\n") + f"\npython: {sp.DEFAULT_ENV_PYTHON}  # written by gpuops setup\n")
    except OSError as exc:
        out.warn(f"could not record python: {sp.DEFAULT_ENV_PYTHON} in {src}: {exc.strerror}; add it by hand")
        return
    out.info(f"{src}: python: {sp.DEFAULT_ENV_PYTHON} (the environment setup made; it sees the system's packages)")


def _local_lock(project: Path, facts) -> Optional[str]:
    """The project's uv.lock as this machine has it, when it is the same file as the host's (for the disk estimate)."""
    want = facts.files.get("uv.lock")
    f = project / "uv.lock"
    if not want or not f.is_file():
        return None
    data = f.read_bytes()
    return data.decode("utf-8", "replace") if hashlib.sha256(data).hexdigest() == want else None


def setup(prof, out, project: Path, *, dry_run: bool = False, verify: bool = True, force: bool = False,
          on_plan: Optional[Callable[[sp.Plan], None]] = None, resolution: Optional[dict] = None,
          scripts: tuple[str, ...] = ()) -> dict:
    """Returns {"plan", "attached", "ran", "rc", "executions", "verify": report or None}. `resolution`: the local
    plan's (project/resolution.py Resolution.to_dict()): setup installs exactly its pins (setup/pinned.py). `scripts`:
    the local plan's script_blocks (the job's scripts with a `# /// script` block): setup installs their blocks, read
    from the synced copies on the host."""
    from .. import knowledge as kb
    from . import scripts as rs
    from ..remote.connection import connect

    prof, adopted = with_environment(prof)
    try:
        sp.env_dir_of(prof.python)  # a profile error before connecting
    except GpuopsError as exc:
        raise type(exc)(exc.message, hint=_sandbox_hint(prof) or exc.hint, code=exc.code) from None
    remote_dir = prof.remote_dir_for(project)
    setup_dir = rs.setup_dir_of(remote_dir)
    knowledge = kb.knowledge(project)
    doc: dict = {"profile": prof.name, "remote_dir": remote_dir, "setup_dir": setup_dir, "plan": None,
                 "attached": False, "ran": False, "rc": None, "verify": None, "python": prof.python,
                 "python_adopted": adopted}
    remote = connect(prof, announce=out.info)
    try:
        with out.status("gathering the host's facts (one remote execution)"):
            facts = rs.gather(remote, remote_dir, prof.python, _packages(prof), _flash_expected(prof),
                              base_python=prof.setup.base_python or "python3",
                              requirements=list(prof.setup.requirements), scripts=tuple(scripts))
        if facts.running:
            doc["attached"] = True
            if dry_run:
                doc["executions"] = remote.exec_count
                out.warn(f"a setup is running on {prof.name} now; `gpuops setup` (without --dry-run) re-attaches")
                return doc
            out.step(f"a setup is already running on {prof.name}: re-attaching to its log ({setup_dir}/log)")
        else:
            plan = sp.make_plan(facts, prof, knowledge, remote_dir=remote_dir, force=force,
                                lock_text=_local_lock(project, facts),
                                tools=kb.load_playbook("images", project).get("project_tools") or [],
                                resolution=resolution, scripts=tuple(scripts))
            doc["plan"] = plan.to_dict()
            if on_plan:
                on_plan(plan)
            if plan.nothing_to_do or dry_run:
                doc["executions"] = remote.exec_count
                if adopted and not dry_run:  # the environment is there already: the profile names it from now on
                    record_environment(prof, out)
                return doc
            if plan.blocked:
                raise ChecksFailed(f"setup cannot install the project on {prof.name}: {plan.blocked}",
                                   hint=plan.blocked_hint)
            if plan.cannot:
                raise ChecksFailed(f"setup cannot start on {prof.name}: {plan.cannot}; nothing was installed",
                                   hint=plan.cannot_hint or "set setup.base_python to an interpreter the host has "
                                                            "(`ls /usr/bin/python3*` on it), or install one there")
            if plan.refusal:
                raise ChecksFailed(f"setup would not fit on {prof.name}: {plan.refusal}; nothing was installed",
                                   hint="free space on the host, or point setup.cache_dir at a bigger disk; "
                                        "setup.disk_check: false goes on anyway (the estimate is in the plan above)")
            rs.start(remote, remote_dir=remote_dir, script=sp.render_script(plan, setup_dir=setup_dir),
                     plan_doc=plan.to_dict())
            doc["ran"] = True
        doc["rc"], doc["failed_step"], tail = _stream(remote, out, remote_dir, prof)
        doc["executions"] = remote.exec_count
    finally:
        remote.close()
    if doc["rc"] != 0:
        raise _failure(prof, doc, setup_dir, tail, knowledge.get("setup_error_lines") or [],
                       knowledge.get("setup_causes") or [])
    if adopted:
        record_environment(prof, out)
    if verify:
        from ..verify.host import check_host

        out.step("verify")
        report, results = check_host(prof, out, project_dir=project)
        doc["verify"] = report
        doc["verify_results"] = results
    return doc


def _failure(prof, doc: dict, setup_dir: str, tail: list[str], patterns=(), causes=()) -> ChecksFailed:
    """A failed setup, said plainly: which step, its exit code (or that the script was killed before it could end),
    a known cause naming the package (setup/failure.py known_cause) or the most telling line of its output, matched
    on whole lines (telling_line), its last lines, shortened as printed."""
    from .failure import known_cause, shorten

    at = f" at step {doc['failed_step']}" if doc.get("failed_step") else ""
    known = known_cause(tail, causes)
    cause = known[0] if known else sp.telling_line(tail, patterns)
    last = (f": {cause}" if cause else "") + (f"; its last lines: {' | '.join(shorten(t, 0, 200) for t in tail[-3:])}"
                                              if tail else "")
    if doc["rc"] == -1:
        return ChecksFailed(f"setup on {prof.name} was killed before it finished{at} (its script left no exit code: "
                            f"out of memory, a reboot, or a kill){last}",
                            hint=f"the whole log is {setup_dir}/log on the host (and `dmesg` for the out-of-memory "
                                 "killer); run `gpuops setup` again: finished steps are not repeated")
    return ChecksFailed(f"setup failed on {prof.name}{at} (exit {doc['rc']}){last}",
                        hint=(f"{known[1]}; " if known and known[1] else "")
                        + f"the whole log is {setup_dir}/log on the host; fix the cause, then run "
                          "`gpuops setup` again (finished steps are not repeated)")


TAIL = 80  # lines of the step's output kept for the failure summary (the telling one is rarely among the last)


def _stream(remote, out, remote_dir: str, prof) -> tuple[int, Optional[str], list[str]]:
    """Show the setup log as it grows, until setup.sh ends: (exit code, failed step, the last lines). A lost
    connection or Ctrl-C leaves it running."""
    from . import scripts as rs

    rc: Optional[int] = None
    failed: Optional[str] = None
    tail: list[str] = []
    current: Optional[str] = None
    try:
        for line in rs.attach(remote, remote_dir):
            code = rs.exit_of(line)
            if code is not None:
                rc = code
            elif line.startswith("@@step "):
                current = line.split()[2] if len(line.split()) > 2 else None
                out.step(line[len("@@step "):])
            elif line.startswith("@@failed "):
                failed = line.split()[1]
                out.warn(f"step {line.split()[1]} failed (exit {line.split()[-1]})")
            elif line == "@@done":
                out.success("every step done")
            else:
                tail = (tail + [line.strip()])[-TAIL:] if line.strip() else tail
                out.info("  " + line)
    except KeyboardInterrupt:
        out.warn(f"setup goes on running on {prof.name}; run `gpuops setup` again to re-attach to it")
        raise
    except ConnectError as exc:
        raise ConnectError(f"{exc.message}; setup goes on running on the host",
                           hint="run `gpuops setup` again to re-attach to it") from exc
    if rc is None:
        raise ConnectError(f"the setup log stream from {prof.host} ended early; setup goes on running on the host",
                           hint="run `gpuops setup` again to re-attach to it")
    if rc == -1 and failed is None:
        failed = current
    from .failure import kept

    return rc, failed, [kept(t) for t in tail]  # whole lines: matched whole, shortened only as printed

"""A job that is a shell command (`gpuops run --prep CMD`): launched detached as `train` launches a script (its own run
folder, log, pid, exit code, the run's environment: the profile's python environment first on PATH, presets, env,
secrets in a 0600 file), so watch, logs, stop and the log's fetch work on it unchanged; recorded locally
(runs/<job id>/meta.json) with its environment snapshot.

What it does not do is the launch gate: a preparation is no GPU job (it is judged by its exit code and its outputs),
so the stack, the GPUs and the script's imports are not asked of the host. Another gpuops run still running on the
host is refused, as for train."""
from __future__ import annotations

import shlex
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterable, Optional

from . import plan as core


def run_command(prof, out, project: Path, *, command: str, name: str, env: Iterable[str] = (),
                seed: Optional[int] = None, snapshot: bool = True,
                clock: Callable[[], datetime] = datetime.now) -> dict:
    """Launch `command` (shell text, run by sh in the remote project folder) detached on the profile's host. Returns
    {run_id, pid, remote_run_dir, local_record}."""
    from . import scripts as rl
    from .actions import _snapshot, connect, new_run

    _, started, rid, plan = new_run(prof, out, project, name=name, key=name, env=env, seed=seed, clock=clock)
    remote_dir = prof.remote_dir_for(project)
    argv = ["sh", "-c", command]
    run_dir = rl.run_dir_of(remote_dir, rid)
    meta = core.build_meta(run_id=rid, script=command, args=[], argv=argv, profile=prof, plan=plan,
                           remote_dir=remote_dir, remote_run_dir=run_dir, git=core.git_info(project), seed=seed,
                           started=started, name=name)
    meta["kind"] = "prep"
    launcher = rl.launcher_script(run_id=rid, remote_dir=remote_dir, argv=argv, python=prof.python,
                                  env=plan.exported, unset=plan.unset,
                                  command=f"sh -c {shlex.quote(command)}")
    remote = connect(prof, out)
    try:
        pid, abs_dir = rl.launch(remote, run_id=rid, remote_dir=remote_dir, meta=meta, launcher=launcher,
                                 secrets=plan.secrets, python=prof.python)
        meta["remote_run_path"], meta["pid"] = abs_dir, pid
        record = core.save_local(meta, project)
        if snapshot:
            _snapshot(remote, prof, out, project, rid, run_dir, seed)
    finally:
        remote.close()
    return {"run_id": rid, "pid": pid, "remote_run_dir": abs_dir, "local_record": str(record)}

"""`gpuops snapshot`, `gpuops diff`, `gpuops matrix`: environment snapshots (core in gpuops/transfer/snapshot.py,
snapshots compared in gpuops/transfer/snapcompare.py)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from .completion import profile_names
from .app import JsonOpt, ProfileOpt, app, output, pick_profile

DEFAULT_OUT = "environment"


def _live(prof, out) -> dict:
    """Connect, capture in ONE remote execution, remember the profile."""
    from ..profiles import model as profiles
    from ..transfer import snapshot as core
    from ..remote.connection import connect

    out.step(f"capturing the environment of {prof.name} ({prof.python}) in one remote execution")
    remote = connect(prof, announce=out.info)
    try:
        snap = core.capture(remote, prof)
    finally:
        remote.close()
    profiles.remember(prof)
    for p in snap.get("problems", []):
        out.warn(f"{prof.name}: {p}")
    return snap


def _wandb_settings(prof_name: str, project: Optional[str]) -> dict:
    """Fail before connecting when W&B cannot work (online without a key). The key itself is never shown."""
    from ..profiles import model as profiles
    from ..transfer import snapshot as core
    from ..errors import UsageError

    env = profiles.environment(Path.cwd())
    if core.wandb_mode(env) not in ("offline", "disabled", "dryrun") and not env.get("WANDB_API_KEY"):
        raise UsageError("--wandb needs WANDB_API_KEY (in the environment or ./.env)",
                         hint="export WANDB_API_KEY=..., or WANDB_MODE=offline and `wandb sync` later")
    return {"project": project or env.get("WANDB_PROJECT") or Path.cwd().resolve().name,
            "entity": env.get("WANDB_ENTITY"), "api_key": env.get("WANDB_API_KEY"), "mode": core.wandb_mode(env),
            "timeout": core.wandb_timeout(env)}


def _check_writable(out_dir: Path) -> None:
    """Create the output folder now, so a bad --out fails before the remote capture rather than after it."""
    from ..errors import UsageError

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot write the snapshot to {out_dir}: {exc.strerror}") from None
    if not out_dir.is_dir():
        raise UsageError(f"cannot write the snapshot to {out_dir}: not a folder")


@app.command()
def snapshot(
    name: Optional[str] = typer.Argument(None, help="Profile name (e.g. lambda-h100, sandbox).", show_default=False,
                                          autocompletion=profile_names),
    profile: Optional[str] = ProfileOpt,
    out_dir: Path = typer.Option(Path(DEFAULT_OUT), "--out", "-o", help="Folder for requirements.txt, "
                                 "environment.json and REPRODUCE.md (replaced if present)."),
    wandb: bool = typer.Option(False, "--wandb", help="Also log the snapshot to Weights & Biases as a versioned "
                                                      "artifact of type 'environment' (needs WANDB_API_KEY)."),
    wandb_project: Optional[str] = typer.Option(None, "--wandb-project", help="W&B project (default: "
                                                "$WANDB_PROJECT, else this folder's name)."),
    json_: bool = JsonOpt,
) -> None:
    """Capture the remote Python environment (pip freeze, Python, CUDA, cuDNN, driver, GPUs) in one remote
    execution into requirements.txt, environment.json and REPRODUCE.md."""
    from ..transfer import snapshot as core

    out = output(json_)
    prof = pick_profile(name, profile)
    wb = _wandb_settings(prof.name, wandb_project) if wandb else None
    _check_writable(out_dir)  # before the remote capture, not after it
    snap = _live(prof, out)
    files = core.save(snap, out_dir)
    info = None
    if wb is not None:
        out.step(f"logging to W&B project {wb['project']}")
        info = core.log_to_wandb(out_dir, snap, run_name=f"{prof.name}-environment", project=wb["project"],
                                 entity=wb["entity"], api_key=wb["api_key"], artifact_name=f"{prof.name}-environment",
                                 mode=wb["mode"], timeout=wb["timeout"])
    if json_:
        out.emit_json({"profile": prof.name, "out": str(out_dir), "files": {k: str(v) for k, v in files.items()},
                       "wandb": info, "snapshot": snap})
        raise typer.Exit(0)
    kv = core.key_versions(snap)
    out.print(f"Environment of {prof.name} at {snap['captured_at']}")
    rows = [("Python", f"{kv['python']}  ({snap.get('python_executable')})"),
            ("torch", (kv["torch"] or "not installed")
             + (f"  CUDA {kv['cuda']}, cuDNN {kv['cudnn'] or 'n/a'}" if kv["cuda"] else ""))]
    rows += [(label, snap[key]) for label, key in (("transformers", "transformers_version"),
                                                   ("numpy", "numpy_version")) if snap.get(key)]
    rows += [("driver", f"{kv['driver'] or 'unknown'}  (supports CUDA {snap.get('cuda_driver_version') or '?'})"),
             ("GPUs", f"{kv['gpu_count']} x {kv['gpu']}" if kv["gpu_count"] else "none detected"),
             ("packages", f"{len(snap['packages'])} ({snap['pip_freeze_source']})")]
    for label, value in rows:
        out.print(f"  {label + ':':<13} {value}")
    out.success(f"wrote {', '.join(str(p) for p in files.values())}")
    if info:
        out.success(f"logged artifact {info['artifact']} (type environment) to W&B project {info['project']} "
                    f"({info['mode']}: {info.get('url') or info['run_dir']})")
    raise typer.Exit(0)


def _resolve(ref: str, out) -> tuple[str, dict]:
    """A snapshot folder or environment.json, a run id (runs/<id>/environment), or a profile (live snapshot)."""
    from ..profiles import model as profiles
    from ..transfer import snapshot as core
    from ..errors import UsageError

    p = Path(ref)
    if p.is_file() and p.suffix in (".yaml", ".yml"):  # a profile given by its path
        prof = profiles.resolve(ref, Path.cwd())
        return f"{prof.name} (live)", _live(prof, out)
    if p.exists():
        return ref, core.load(p)
    run_env = core.find_run_env(ref, Path.cwd())
    if run_env is not None:
        return f"run {run_env.parent.name}", core.load(run_env)
    if ref in profiles.available(Path.cwd()):
        prof = profiles.resolve(ref, Path.cwd())
        return f"{prof.name} (live)", _live(prof, out)
    raise UsageError(f"'{ref}' is not a snapshot folder, an environment.json, a run id (runs/<id>/environment) "
                     "or a profile name", hint="take one with `gpuops snapshot --out DIR`")


@app.command()
def diff(
    a: str = typer.Argument(..., help="Snapshot folder, environment.json, run id or profile (live snapshot).",
                            show_default=False),
    b: str = typer.Argument(..., help="The same kinds as A.", show_default=False),
    json_: bool = JsonOpt,
) -> None:
    """What changed between two environments: Python, CUDA, driver, GPUs, packages added/removed/changed.
    Exit 0 when identical, 1 when they differ."""
    from ..transfer import snapcompare

    out = output(json_)
    la, sa = _resolve(a, out)
    lb, sb = _resolve(b, out)
    d = snapcompare.diff(sa, sb)
    if json_:
        out.emit_json({"a": la, "b": lb, **d})
    else:
        for line in snapcompare.render_diff(d, la, lb):
            out.print(line)
    raise typer.Exit(0 if d["identical"] else 1)


@app.command()
def matrix(
    profiles_: Optional[List[str]] = typer.Option(None, "--profile", "-p", help="Profile to snapshot live; repeat "
                                                  "for a column per profile.", show_default=False),
    from_: Optional[List[Path]] = typer.Option(None, "--from", help="Saved snapshot (folder, environment.json or "
                                               "run folder); repeatable.", show_default=False),
    out_file: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the Markdown to this file instead of "
                                             "stdout."),
    json_: bool = JsonOpt,
) -> None:
    """The environment matrix in Markdown (component, version, how verified) for a project's docs, from live
    snapshots (-p) or saved ones (--from). Without either: ./environment if saved there, else the default profile."""
    from ..profiles import model as profiles
    from ..transfer import snapcompare, snapshot as core
    from ..paths import write_atomic

    out = output(json_)
    snaps: list[tuple[str, dict]] = []
    for ref in from_ or []:
        s = core.load(ref)
        snaps.append(((s.get("source") or {}).get("profile") or str(ref), s))
    for ref in profiles_ or []:
        prof = profiles.resolve(ref, Path.cwd())
        snaps.append((prof.name, _live(prof, out)))
    if not snaps:
        if (Path(DEFAULT_OUT) / "environment.json").is_file():
            s = core.load(DEFAULT_OUT)
            snaps.append(((s.get("source") or {}).get("profile") or DEFAULT_OUT, s))
        else:
            prof = pick_profile(None, None)
            snaps.append((prof.name, _live(prof, out)))
    seen: dict[str, int] = {}
    labelled = []
    for label, s in snaps:  # two snapshots of one profile: tell them apart by date
        seen[label] = seen.get(label, 0) + 1
        labelled.append((label if seen[label] == 1 else f"{label} ({str(s.get('captured_at'))[:10]}, #{seen[label]})", s))
    m = snapcompare.matrix(labelled)
    text = snapcompare.render_matrix(m)
    if out_file:
        write_atomic(out_file, text)
        out.success(f"wrote {out_file}")
    if json_:
        out.emit_json({**m, "markdown": text})
    elif not out_file:  # -o FILE: the file is the output (as sort -o, curl -o); until #36 stdout got it too
        out.print(text.rstrip("\n"))
    raise typer.Exit(0)

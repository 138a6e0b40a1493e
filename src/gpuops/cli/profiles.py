"""`gpuops profiles` and `gpuops profiles show NAME`: what profiles exist, and what one resolves to."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .completion import profile_names
from .app import Group, JsonOpt, app, output, pick_profile

profiles_app = typer.Typer(cls=Group, help="List profiles, or show one as gpuops resolves it (secret values masked).",
                           invoke_without_command=True)
app.add_typer(profiles_app, name="profiles")

SECRET_HINTS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD")


@profiles_app.callback()
def list_profiles(ctx: typer.Context, json_: bool = JsonOpt,
                  all_: bool = typer.Option(False, "--all", help="Also the profiles of terminated instances (kept "
                                                                 "for their history, hidden by default).")) -> None:
    """List the profiles found (project, user, packaged examples), and which one is selected here. Profiles of
    terminated instances (every `gpuops run` writes one) are left out unless --all."""
    if ctx.invoked_subcommand:
        return
    from ..profiles import model as profiles

    out = output(json_)
    cwd = Path.cwd()
    found = profiles.available(cwd)
    mine = profiles.available(cwd, examples=False)
    from ..profiles.write import marked

    last = profiles.last_used(cwd)
    marks = {r["name"]: r for r in marked(cwd)}
    rows = [{"name": n, "file": str(p), "example": n not in mine, "default_here": n == last,
             "mark": (marks.get(n) or {}).get("mark"), "prunable": bool((marks.get(n) or {}).get("prunable")),
             "terminated": n in mine and profiles.terminated(p)} for n, p in found.items()]
    hidden = 0 if all_ else sum(r["terminated"] for r in rows)
    rows = rows if all_ else [r for r in rows if not r["terminated"]]
    if hidden:
        out.info(f"{hidden} profiles of terminated instances not shown: gpuops profiles --all "
                 "(`gpuops profiles prune` removes them)")
    if json_:
        out.emit_json(rows)
        return
    if not rows:
        out.print("no profiles found; `gpuops sandbox up` writes one named 'sandbox'")
        return
    if any(r["prunable"] for r in rows):
        out.info(f"{sum(r['prunable'] for r in rows)} leftover profile(s) (a terminated instance's, a finished "
                 "run's): `gpuops profiles prune` removes them")
    for r in rows:
        flags = " (example)" if r["example"] else ""
        flags += f" ({r['mark']})" if r["mark"] else (" (terminated)" if r["terminated"] else "")
        flags += " (default here)" if r["default_here"] else ""
        out.print(f"{r['name']:<28} {r['file']}{flags}")


@profiles_app.command("show")
def show(name: Optional[str] = typer.Argument(None, help="Profile name or path.", show_default=False,
                                         autocompletion=profile_names),
         json_: bool = JsonOpt) -> None:
    """Print a profile as resolved (defaults filled, ${VAR} expanded, secret-looking values masked)."""
    out = output(json_)
    prof = pick_profile(name, announce=False)
    data = prof.model_dump(mode="json", exclude={"source"})
    secret_names = set(prof.secrets) | {"WANDB_API_KEY"}
    data["env"] = {k: ("***" if k in secret_names or any(h in k.upper() for h in SECRET_HINTS) else v)
                   for k, v in data["env"].items()}
    data["file"] = str(prof.source)
    if json_:
        out.emit_json(data)
        return
    import yaml

    out.print(f"# {prof.source}")
    out.print(yaml.safe_dump(data, sort_keys=False).rstrip())


@profiles_app.command("use")
def use(name: str = typer.Argument(..., metavar="NAME", help="The profile every command uses here when none is named.",
                                   show_default=False, autocompletion=profile_names)) -> None:
    """Make NAME this project folder's default profile: the one `train`, `fetch`, `watch`... use when none is named.
    Naming another profile on one command (`gpuops verify other`) never changes it."""
    from ..profiles import model as profiles

    out = output(False)
    prof = profiles.resolve(name, Path.cwd())  # a typo: "did you mean", nothing written
    before = profiles.use(prof.name, Path.cwd())
    if before == prof.name:
        out.info(f"'{prof.name}' is already the default profile here")
    else:
        out.success(f"default profile here: '{prof.name}'" + (f" (was '{before}')" if before else ""))


@profiles_app.command("prune")
def prune(yes: bool = typer.Option(False, "--yes", "-y", help="Remove without asking (needed when stdin is not a "
                                                               "terminal)."),
          dry_run: bool = typer.Option(False, "--dry-run", help="List what would go, remove nothing."),
          json_: bool = JsonOpt) -> None:
    """Remove leftover profiles: those of terminated instances and of finished `gpuops run`s (run-*). Never the
    profile of a live instance, nor a hand-written profile without an instance, nor a packaged example."""
    import sys

    from ..errors import GpuopsError
    from ..profiles import write as profile_ops

    out = output(json_)
    rows = [r for r in profile_ops.marked(Path.cwd()) if r["prunable"]]
    doc = {"prunable": [r["name"] for r in rows], "removed": []}
    if not rows:
        out.info("no leftover profiles")
    else:
        for r in rows:
            out.print(f"{r['name']:<28} {r['file']} ({r['mark']})")
    if rows and not dry_run:
        if not yes:
            if not sys.stdin.isatty():
                raise GpuopsError(f"{len(rows)} profile(s) not removed: not confirmed",
                                  hint="gpuops profiles prune --yes (or --dry-run to list them)")
            if not typer.confirm(f"remove these {len(rows)} profile file(s)?", default=False, err=True):
                out.info("nothing removed")
                raise typer.Exit(1)
        doc["removed"] = profile_ops.prune(rows)
        out.success(f"removed {len(doc['removed'])} profile(s): {', '.join(doc['removed'])}")
    if json_:
        out.emit_json(doc)


@profiles_app.command("new")
def new(
    name: str = typer.Argument(..., metavar="NAME", help="Profile name: a file-safe word (letters, digits, - _ .), e.g. lambda-h100.",
                               show_default=False),
    host: str = typer.Option(..., "--host", metavar="IP", help="The instance's IP address or DNS name (with --slurm: "
                             "the cluster's login node).",
                             show_default=False),
    key: Optional[Path] = typer.Option(None, "--key", metavar="PATH", help="Private key (must be chmod 600; default: "
                                       "ssh-agent and ~/.ssh/id_*).", show_default=False),
    user: str = typer.Option("ubuntu", "--user", help="SSH user (Lambda: ubuntu)."),
    port: int = typer.Option(22, "--port", min=1, max=65535, help="SSH port."),
    instance_type: Optional[str] = typer.Option(None, "--type", metavar="TYPE", help="Instance type (e.g. "
                                                "gpu_1x_h100_sxm5): expect its GPU, count and memory, and its preset.",
                                                show_default=False),
    remote_dir: Optional[str] = typer.Option(None, "--remote-dir", metavar="DIR", help="Project folder on the host "
                                             "(default: ~/<this folder's name>).", show_default=False),
    python: str = typer.Option("python3", "--python", metavar="PATH", help="Remote interpreter you train with."),
    from_host: bool = typer.Option(False, "--from-host", help="Connect once and expect what the host has now (GPU, "
                                   "driver, CUDA, Python, torch/vision/audio, vLLM, flash-attn)."),
    project: bool = typer.Option(True, "--project/--user-config", help="Write to ./profiles/ (default) or to the "
                                 "user config folder (~/.config/gpuops/profiles/)."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing profile of that name."),
    slurm: bool = typer.Option(False, "--slurm", help="--host is a Slurm cluster's login node: connect once and write "
                               "`slurm:` from its sinfo/scontrol (partition, GPUs per node from gres, time limit)."),
    partition: Optional[str] = typer.Option(None, "--partition", metavar="NAME", help="With --slurm: the partition "
                                            "(default: the cluster's default one).", show_default=False),
) -> None:
    """Write a commented, validated profile from an IP and a key (never overwrites without --force). With --slurm,
    for a Slurm cluster: the login node is read once (docs/slurm.md)."""
    from ..profiles import write as profile_ops

    out = output(False)
    if partition and not slurm:
        from ..errors import UsageError

        raise UsageError("--partition is for --slurm")
    if slurm:
        from ..errors import UsageError
        from ..slurm.profile_draft import new_profile

        if instance_type or from_host:
            raise UsageError("--type and --from-host are for a single instance; with --slurm the nodes are read "
                             "through Slurm: `gpuops verify NAME` checks them, `gpuops profiles pin` is not for them")
        from ..profiles import model as profiles

        profiles.check_name(name)
        dest = profile_ops.destination(name, user_config=not project, project_dir=Path.cwd())
        if dest.exists() and not force:
            raise UsageError(f"{dest} exists; not overwritten", hint="add --force to replace it")
        dest = new_profile(out, name=name, dest=dest, host=host, key=profile_ops.check_key(key), user=user, port=port,
                           remote_dir=remote_dir, python=python, partition=partition, project_dir=Path.cwd())
        out.success(f"wrote profile '{name}' for the Slurm cluster behind {host}: {dest}")
        out.info(f"next: check remote_dir (the shared folder) in it, then: gpuops verify {name}")
        return
    dest = profile_ops.new(out, name=name, host=host, key=key, user=user, port=port, instance_type=instance_type,
                           remote_dir=remote_dir, python=python, user_config=not project, force=force,
                           from_host=from_host, project_dir=Path.cwd())
    out.success(f"wrote profile '{name}': {dest}")
    out.info(f"next: gpuops verify {name}" + ("" if from_host else
                                            f"   (or record the host's stack first: gpuops profiles pin {name})"))


@profiles_app.command("pin")
def pin(
    name: Optional[str] = typer.Argument(None, help="Profile name or path (default: the one selected here).",
                                         show_default=False, autocompletion=profile_names),
    yes: bool = typer.Option(False, "--yes", "-y", help="Write without asking (not asked either when stdin is not "
                                                        "a terminal)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show the change, write nothing."),
    json_: bool = JsonOpt,
) -> None:
    """Connect once and record what the host has now (GPU, driver, CUDA, Python, packages) in the profile's
    expect: block; shows the change as a diff first. Comments outside expect: are kept."""
    import sys

    from ..profiles import write as profile_ops

    out = output(json_)
    prof = pick_profile(name)

    def confirm(question: str) -> bool:
        return typer.confirm(question, default=False, err=True) if sys.stdin.isatty() else True

    raise typer.Exit(profile_ops.pin(out, prof, project_dir=Path.cwd(), yes=yes, dry_run=dry_run, confirm=confirm))

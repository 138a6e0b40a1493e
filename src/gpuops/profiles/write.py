"""`gpuops profiles new` and `gpuops profiles pin`: the talking half. Text comes from profile_text (pure); every text
passes profiles.profile_from_text, the gate of a hand-written profile, before it is written (atomically)."""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Callable

from . import text as pt
from ..errors import AuthError, UsageError


def destination(name: str, *, user_config: bool, project_dir: Path) -> Path:
    from ..paths import config_dir

    folder = config_dir() / "profiles" if user_config else project_dir / "profiles"
    return folder / f"{name}.yaml"


def check_key(key: Path | None) -> Path | None:
    """The key as an absolute path, refused (exit 2) when missing, unreadable or readable by others."""
    from ..remote.connection import check_key_file

    if key is None:
        return None
    key = key.expanduser().absolute()
    try:
        check_key_file(key)
    except AuthError as exc:
        raise UsageError(f"--key: {exc.message}", hint=exc.hint) from None
    return key


def type_expectations(instance_type: str, project_dir: Path) -> pt.Expectations:
    from ..verify import gpus

    hit = gpus.for_instance_type(instance_type, project_dir)
    if hit is None:
        types = sorted({t for r in gpus.load(project_dir) for t in r.lambda_instance_types})
        close = difflib.get_close_matches(instance_type, types, n=3)
        raise UsageError(f"--type {instance_type!r} is not an instance type in playbooks/gpus.yaml"
                         + (f"; did you mean {', '.join(close)}?" if close else ""),
                         hint="leave --type out and use --from-host to record what the host has, or add a row to "
                              "playbooks/gpus.yaml")
    row, count = hit
    return pt.from_gpu_row(row, count, instance_type)


def host_expectations(profile, out, project_dir: Path) -> pt.Expectations:
    """One connection (trust on first use, fingerprint announced), one probe execution, expectations of what is there."""
    from ..verify import gpus
    from .. import knowledge as kb
    from ..verify.facts import from_probe
    from ..remote.connection import connect
    from ..remote.gather import gather
    from ..verify.host import probe_params

    pb = kb.load_playbook("verify", project_dir)
    params = probe_params(profile, pb, kb.presets(project_dir), project_dir)
    params["packages"] = sorted(set(params["packages"]) | set(pt.PIN_PACKAGES) | set(profile.expect.packages))
    with out.status(f"connecting to {profile.user}@{profile.host}:{profile.port}"):
        remote = connect(profile, announce=out.info)
    try:
        with out.status("gathering facts (one remote execution)"):
            doc = gather(remote, params, python=profile.python)
    finally:
        remote.close()
    facts = from_probe(doc, host=profile.host, failures=kb.knowledge(project_dir).get("nvidia_smi_failures", []))
    wanted = tuple(dict.fromkeys(pt.PIN_PACKAGES + tuple(profile.expect.packages)))
    return pt.from_facts(facts, packages=wanted, match=lambda n: gpus.match(n, project_dir))


def new(out, *, name: str, host: str, key: Path | None, user: str, port: int, instance_type: str | None,
        remote_dir: str | None, python: str, user_config: bool, force: bool, from_host: bool,
        project_dir: Path) -> Path:
    from . import model as profiles
    from ..paths import write_atomic

    profiles.check_name(name)
    dest = destination(name, user_config=user_config, project_dir=project_dir)
    if dest.exists() and not force:
        raise UsageError(f"{dest} exists; not overwritten", hint=f"add --force to replace it, or `gpuops profiles pin "
                                                                 f"{name}` to record the host's stack in it")
    key = check_key(key)
    home = str(Path.home()).rstrip("/") + "/"
    for label, value in (("--remote-dir", remote_dir), ("--python", python)):
        if value and value.startswith(home):  # the local shell expanded ~: the remote home is meant
            out.warn(f"{label} {value} is under your local home; writing it as ~/{value[len(home):]} (the remote home)")
    remote_dir = "~/" + remote_dir[len(home):] if remote_dir and remote_dir.startswith(home) else remote_dir
    python = "~/" + python[len(home):] if python.startswith(home) else python
    expect = type_expectations(instance_type, project_dir) if instance_type else pt.Expectations()
    price = (None, "")
    if instance_type:
        from ..cloud.prices import listed_price

        price = listed_price(instance_type, project_dir, warn=out.warn)
    how = "gpuops profiles new" + (" --from-host" if from_host else "") + (f" --type {instance_type}" if instance_type else "")

    def text_for(e: pt.Expectations) -> str:
        return pt.render(name, host=host, user=user, port=port, key=str(key) if key else None, remote_dir=remote_dir,
                         python=python, instance_type=instance_type, expect=e, written_by=how, price=price)

    text = text_for(expect)
    prof = profiles.profile_from_text(text, dest, project_dir)  # the hand-written profile's gate, before anything
    if from_host:
        got = host_expectations(prof, out, project_dir)
        for w in got.warnings:
            out.warn(w)
        if instance_type and expect.values.get("gpu") and got.values.get("gpu") and \
                expect.values["gpu"] != got.values["gpu"]:
            out.warn(f"--type {instance_type} has {expect.values['gpu']}, the host has {got.values['gpu']}: "
                     "the profile expects what the host has")
        if not got.preset:
            got.preset, got.preset_note = expect.preset, expect.preset_note
        text = text_for(got)
        profiles.profile_from_text(text, dest, project_dir)
    write_atomic(dest, text)
    return dest


def pin(out, prof, *, project_dir: Path, yes: bool, dry_run: bool, confirm: Callable[[str], bool]) -> int:
    """Record what the profile's host has now in its expect: block, showing the change as a diff first."""
    from . import model as profiles
    from ..paths import data_dir, write_atomic

    path = prof.source
    if path is None or data_dir("profiles") in path.resolve().parents:
        raise UsageError(f"'{prof.name}' is a packaged example ({path}); pin a copy of your own",
                         hint=f"gpuops profiles new {prof.name} --host IP --key PATH --from-host")
    old_text = path.read_text(encoding="utf-8")
    got = host_expectations(prof, out, project_dir)
    for w in got.warnings:
        out.warn(w)
    old = prof.expect.model_dump(exclude_none=True)
    new_text = pt.replace_expect(old_text, pt.merge_expect(old, got), got.notes)
    profiles.profile_from_text(new_text, path, project_dir)
    change = pt.diff(old_text, new_text, str(path))
    if not change:
        out.success(f"{path}: already expects what the host has; nothing to change")
        return 0
    if not out.json_mode:
        out.print(change.rstrip("\n"))
    write = not dry_run and (yes or confirm(f"write these expectations to {path}?"))
    if write:
        write_atomic(path, new_text)
    if out.json_mode:
        out.emit_json({"profile": prof.name, "file": str(path), "diff": change, "written": write,
                       "expect": pt.merge_expect(old, got)})
    if dry_run:
        out.info("dry run: nothing written")
    elif not write:
        out.info("nothing written")
        return 1
    else:
        out.success(f"pinned {prof.name}: {path}")
        out.info(f"next: gpuops verify {prof.name}")
    return 0


def marked(project_dir: Path) -> list[dict]:
    """Every profile of this user and project (examples left out) with its mark (profiles.marks), read from the
    profiles and this machine's launch ledger, no network. A profile that does not load is never marked."""
    from . import marks
    from . import model as profiles
    from ..cloud.ledger import Ledger

    states = {r.instance_id: r.state for r in Ledger().records() if r.instance_id}
    rows = []
    for name, path in profiles.available(project_dir, examples=False).items():
        try:
            prof = profiles.load_profile(path, project_dir)
        except Exception:  # noqa: BLE001 - a broken profile is shown as it is, never pruned
            rows.append({"name": name, "file": str(path), "mark": None, "prunable": False})
            continue
        m = marks.mark(prof.name or name, prof.cloud, states)
        rows.append({"name": name, "file": str(path), "mark": m.text, "prunable": m.prunable})
    return rows


def prune(rows: list[dict]) -> list[str]:
    """Remove the profile files of `rows` (each prunable, as marked() said); returns the names removed."""
    gone = []
    for r in rows:
        if r["prunable"]:
            Path(r["file"]).unlink(missing_ok=True)
            gone.append(r["name"])
    return gone

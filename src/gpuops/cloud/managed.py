"""The profiles `gpuops up` writes (managed profiles, in the user config folder): written after the launch,
read back by down, reap, ls and run, marked gone when their instances end; a --from template's settings."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..errors import GpuopsError, UsageError
from . import decisions as d
from .api import Instance
from .instances import NAME_RE


def profile_file(name: str) -> Path:
    from ..paths import config_dir

    return config_dir() / "profiles" / f"{name}.yaml"


# what `up` writes itself: the host part of a profile; every other key of a --from template is carried over
HOST_KEYS = ("name", "host", "hosts", "port", "user", "key", "private_ip", "region", "instance_type", "price_per_hour",
             "host_key_policy", "host_key", "cloud")


def template_settings(prof) -> dict:
    """--from PROFILE: the profile file's own settings (python, remote_dir, expect, setup, sync, env_preset, env,
    secrets, fetch, checks, ...) without its host part, which the launch replaces. Read from the file as written, so
    defaults stay defaults; the profile was validated by loading it."""
    import yaml

    if prof.source is None or not Path(prof.source).is_file():
        raise UsageError(f"--from {prof.name}: the profile has no file to take settings from")
    doc = yaml.safe_load(Path(prof.source).read_text()) or {}
    return {k: v for k, v in doc.items() if k not in HOST_KEYS}


def template_for(name: Optional[str], project_dir: Path) -> Optional[dict]:
    """--from PROFILE (None: no template), read and validated before anything is launched."""
    if not name:
        return None
    from ..profiles.model import resolve

    return template_settings(resolve(name, project_dir))


def write_profile(name: str, insts: list[Instance], key: Path, itype, cloud: dict, *, user: str = "ubuntu",
                  template: Optional[dict] = None, host_keys: Optional[list] = None):
    """The profile NAME in the user config folder, validated by the same loader as a hand-written one. Several
    instances (a fleet, rank order): `hosts:` with each one's public and private address. host_keys: each
    instance's host key as made for its launch (`host_key:`, by which alone it is judged: Lambda reuses addresses)."""
    import yaml

    from ..paths import write_atomic
    from ..profiles.model import load_profile

    first = insts[0]
    pins = list(host_keys or [None] * len(insts))
    if len(insts) > 1:
        doc = {"hosts": [{"host": i.ip, "private_ip": i.private_ip or i.ip, **({"host_key": k} if k else {})}
                         for i, k in zip(insts, pins)]}
    else:
        doc = {"host": first.ip, **({"host_key": pins[0]} if pins[0] else {})}
    doc.update({"user": user, "port": 22, "key": str(key.expanduser().resolve()),
                "region": first.region, "instance_type": itype.name, "price_per_hour": itype.price_per_hour,
                "host_key_policy": "strict"})
    settings = dict(template or {})
    fss = cloud.get("filesystems") or []
    if fss:  # the job sees the first filesystem's mount point; setup's caches live on it (a replacement's setup is fast)
        mount = fss[0]["mount_point"]
        # Hugging Face's models and datasets too (HF_HOME): a fresh instance does not download them again; a
        # template's own HF_HOME is kept
        settings["env"] = {"HF_HOME": f"{mount.rstrip('/')}/gpuops/cache/huggingface",
                           **(settings.get("env") or {}), "GPUOPS_FS": mount}
        setup = dict(settings.get("setup") or {})
        setup.setdefault("cache_dir", f"{mount.rstrip('/')}/gpuops/cache")
        settings["setup"] = setup
    # what was launched (its GPU, count and memory), over the template's other expectations
    expect = d.launched_expect(itype, settings.pop("expect", None))
    preset = d.launched_preset(itype)  # the GPU's env preset, as `sandbox up --gpu` names it; a template's wins
    if preset and "env_preset" not in settings:
        settings["env_preset"] = preset
    doc.update(settings)
    if expect:
        doc["expect"] = expect
    doc["cloud"] = {k: v for k, v in cloud.items() if v is not None}
    what = (f"Lambda instance {first.id}" if len(insts) == 1 else
            f"a fleet of {len(insts)} Lambda instances ({', '.join(i.id for i in insts)})")
    text = (f"# written by `gpuops up` for {what} ({itype.name}, ${itype.price_per_hour:.2f}/h"
            + (" each" if len(insts) > 1 else "") + ").\n"
            f"# `gpuops down {name}` terminates {'it' if len(insts) == 1 else 'them all'}; the host key"
            f"{'' if len(insts) == 1 else 's'} pinned before the first connection.\n"
            + yaml.safe_dump(doc, sort_keys=False))
    f = profile_file(name)
    write_atomic(f, text)
    return load_profile(f)


def unpin(name: str, host: str) -> None:
    """--trust-new: the host at `host` did not present the key made for its launch; its `host_key:` leaves profile
    NAME (the key it presents is trusted on first use instead, as for a hand-written profile)."""
    import yaml

    from ..paths import write_atomic

    f = profile_file(name)
    text = f.read_text()
    doc = yaml.safe_load(text) or {}
    for entry in [doc] + [h for h in doc.get("hosts") or [] if isinstance(h, dict)]:
        if entry.get("host") == host or (entry is doc and not doc.get("hosts")):
            entry.pop("host_key", None)
    header = "".join(ln for ln in text.splitlines(keepends=True) if ln.startswith("#"))
    write_atomic(f, header + yaml.safe_dump(doc, sort_keys=False))


def _forget_profile(name: str, insts: list) -> None:
    from ..remote import hostkeys

    for inst in insts:
        if inst is not None and inst.ip:
            hostkeys.forget(inst.ip, 22)
    f = profile_file(name)
    if f.is_file():
        mark_profile_gone(f)


def mark_profile_gone(f: Path) -> None:
    import yaml

    from ..paths import write_atomic

    text = f.read_text()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return
    if isinstance(doc, dict) and isinstance(doc.get("cloud"), dict):
        doc["cloud"]["state"] = "gone"
        note = "# the instance was terminated: this profile is kept for its history.\n"
        head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#") and line + "\n" != note)
        write_atomic(f, head + note + yaml.safe_dump(doc, sort_keys=False))


def managed_profile(name: str):
    """The profile `gpuops up` wrote for NAME (the user config folder, never a project's profiles/), or None."""
    from ..profiles.model import load_profile

    if not NAME_RE.match(name):
        return None
    f = profile_file(name)
    if not f.is_file():
        return None
    try:
        prof = load_profile(f)
    except GpuopsError:
        return None
    return prof if prof.cloud is not None else None


def _profile_of_instance(instance_id: str):
    """The managed profile (user config folder) that names this instance as one it runs, or None."""
    for name, cloud in local_cloud_profiles().items():
        if d.profile_names_instance(cloud, instance_id):
            return managed_profile(name)
    return None


def local_cloud_profiles() -> dict[str, dict]:
    """Managed profiles in the user config folder: name -> cloud block."""
    import yaml

    out = {}
    d_ = profile_file("x").parent
    if not d_.is_dir():
        return out
    for f in sorted(d_.glob("*.yaml")):
        try:
            doc = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("cloud"), dict):
            out[f.stem] = doc["cloud"]
    return out

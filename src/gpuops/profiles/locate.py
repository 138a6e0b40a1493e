"""Which profile file a command means, and this project's default: no pydantic here (a sync starts without it).

Lookup order: ./profiles/, the user config directory (~/.config/gpuops/profiles), the packaged examples.
Selection: explicit name, else GPUOPS_PROFILE, else the profile last used successfully here, else the only one.
model.resolve() validates the file chosen here; memo.py keeps what it validated.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import ProfileError
from ..paths import config_dir, data_dir, state_dir, write_atomic

PROFILE_SUFFIXES = (".yaml", ".yml")


def search_dirs(project_dir: Path | None = None) -> list[Path]:
    project_dir = project_dir or Path.cwd()
    return [project_dir / "profiles", config_dir() / "profiles", data_dir("profiles")]


def available(project_dir: Path | None = None, *, examples: bool = True) -> dict[str, Path]:
    """name -> file, earlier directories shadowing later ones (examples: include the packaged ones)."""
    found: dict[str, Path] = {}
    dirs = search_dirs(project_dir)
    for d in dirs if examples else dirs[:2]:
        if not d.is_dir():
            continue
        for f in sorted(d.iterdir()):
            if f.suffix in PROFILE_SUFFIXES and f.is_file() and f.stem not in found:
                found[f.stem] = f
    return found


def terminated(path: Path) -> bool:
    """A profile `gpuops up`/`run` wrote for an instance since terminated (cloud.state: gone, kept for its history).
    An unreadable file is not one: it stays listed, so its error is found."""
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    cloud = doc.get("cloud") if isinstance(doc, dict) else None
    return isinstance(cloud, dict) and cloud.get("state") == "gone"


def _last_used_file() -> Path:
    return state_dir() / "last_profile.json"


def _defaults() -> dict:
    try:
        data = json.loads(_last_used_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def use(name: str, project_dir: Path | None = None) -> str | None:
    """Make `name` this project directory's default profile (`gpuops profiles use NAME`); returns the one before."""
    key = str((project_dir or Path.cwd()).resolve())
    data = _defaults()
    before = data.get(key)
    if before != name:
        data[key] = name
        write_atomic(_last_used_file(), json.dumps(data, indent=1))
    return before


def remember(profile: Any, project_dir: Path | None = None) -> bool:
    """After a successful command: the profile becomes this project directory's default only when it has none yet
    (or its default no longer exists). A command on another profile never moves the default (`verify OTHER` would
    silently send the next `train` and `fetch` there): only `gpuops profiles use NAME` does. True when it was set."""
    key = str((project_dir or Path.cwd()).resolve())
    data = _defaults()
    now = data.get(key)
    if now == profile.name or (now and now in available(project_dir or Path.cwd())):
        return False
    data[key] = profile.name
    try:
        write_atomic(_last_used_file(), json.dumps(data, indent=1))
    except OSError:
        return False
    return True


def last_used(project_dir: Path | None = None) -> str | None:
    """This project directory's default profile: set by `gpuops profiles use`, or the first one used successfully."""
    return _defaults().get(str((project_dir or Path.cwd()).resolve()))


def selected_how(name: str | None, profile: Any, project_dir: Path | None = None) -> str:
    """Why `profile` was chosen (for the `profile: NAME (...)` line every command starts with), and where the
    project's default stays when another was given."""
    project_dir = project_dir or Path.cwd()
    default = last_used(project_dir)
    if default and default not in available(project_dir):
        default = None
    if name:
        if default and default != profile.name:
            return f"given; the default here stays '{default}', `gpuops profiles use {profile.name}` changes it"
        return "given" if default else "given; the default here once this succeeds"
    if os.environ.get("GPUOPS_PROFILE"):
        return "from GPUOPS_PROFILE"
    return "the default here" if default == profile.name else "the only one"


def locate(name: str | None = None, project_dir: Path | None = None) -> Path:
    """The profile file meant: name (a name or a path), else $GPUOPS_PROFILE, else last used, else the only one."""
    project_dir = project_dir or Path.cwd()
    if name and (name.endswith(PROFILE_SUFFIXES) or "/" in name):
        p = Path(name).expanduser()
        if not p.is_file():
            raise ProfileError(f"profile file not found: {name}")
        return p
    found = available(project_dir)
    how = "given"
    if not name and os.environ.get("GPUOPS_PROFILE"):
        name, how = os.environ["GPUOPS_PROFILE"], "from GPUOPS_PROFILE"
    if not name:
        name = last_used(project_dir)
        how = "last used here"
        if name and name not in found:
            name = None
    if not name:
        # a terminated instance's profile (kept for its history) is never "the only one": four finished runs left
        # four such profiles beside the one a user means (issue #36)
        everything = available(project_dir, examples=False)
        ended = [n for n, f in everything.items() if terminated(f)]
        mine = {n: f for n, f in everything.items() if n not in ended}
        if len(mine) == 1:
            name = next(iter(mine))
        else:
            listing = ", ".join(mine) if mine else "none"
            examples = ", ".join(n for n in found if n not in everything)
            gone = (f"; not counted: {len(ended)} of terminated instances ({', '.join(ended[:6])}"
                    f"{', ...' if len(ended) > 6 else ''}; `gpuops profiles prune` removes them)") if ended else ""
            raise ProfileError(
                f"which profile? found {len(mine)}: {listing}" + (f" (examples: {examples})" if examples else "")
                + gone,
                hint="name one (gpuops verify NAME, or -p NAME), or set GPUOPS_PROFILE; "
                     "`gpuops sandbox up` writes a local one named 'sandbox'",
            )
    if name not in found:
        import difflib

        close = difflib.get_close_matches(name, list(found), n=1)
        tip = f"; did you mean '{close[0]}'?" if close else ""
        listing = ", ".join(found) if found else "none"
        raise ProfileError(f"no profile named '{name}' ({how}){tip}",
                           hint=f"profiles found: {listing}; searched " + ", ".join(str(d) for d in search_dirs(project_dir)))
    return found[name]

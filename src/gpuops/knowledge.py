"""Load playbooks and knowledge (YAML data under playbooks/). ./playbooks/<name>.yaml in the project overrides
the built-in file of the same name."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .errors import UsageError
from .paths import data_dir


def playbook_path(name: str, project_dir: Path | None = None) -> Path:
    local = (project_dir or Path.cwd()) / "playbooks" / f"{name}.yaml"
    return local if local.is_file() else data_dir("playbooks") / f"{name}.yaml"


def load_yaml(path: Path) -> dict:
    return _load(str(path), path.stat().st_mtime if path.exists() else 0)


def yaml_loader():
    """PyYAML's C loader (libyaml) where this PyYAML has it: ~8x faster on the playbooks than the pure-Python one
    (benchmarks/bench_verify.py); the same safe constructor, so the same documents."""
    import yaml

    return getattr(yaml, "CSafeLoader", None) or yaml.SafeLoader


@lru_cache(maxsize=16)
def _load(path: str, _mtime: float) -> dict:
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.load(fh, Loader=yaml_loader()) or {}  # noqa: S506 - a safe loader
    except FileNotFoundError:
        raise UsageError(f"playbook not found: {path}") from None
    except yaml.YAMLError as exc:  # one line, as a profile's (profiles.model): where, and what
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UsageError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a mapping at the top level")
    _check_preset_names(doc, path)
    return doc


def _check_preset_names(doc: dict, path: str) -> None:
    """Preset variables go into launch.sh as `NAME=value`: their names must be variable names (exit 2 otherwise)."""
    import re

    for pname, preset in ((doc.get("presets") or {}) if isinstance(doc.get("presets"), dict) else {}).items():
        for k in ((preset or {}).get("env") or {}) if isinstance(preset, dict) else {}:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k)):
                raise UsageError(f"{path}: presets.{pname}.env: {str(k)!r} is not a variable name "
                                 "(letters, digits and _, not starting with a digit)")


def load_playbook(name: str, project_dir: Path | None = None, path: str | None = None) -> dict:
    return load_yaml(Path(path) if path else playbook_path(name, project_dir))


def knowledge(project_dir: Path | None = None) -> dict:
    return load_playbook("knowledge", project_dir)


def presets(project_dir: Path | None = None) -> dict:
    return load_playbook("presets", project_dir)


def preset_env(name: str | None, project_dir: Path | None = None) -> dict[str, str]:
    """Variables of an env preset (name -> value); unknown preset names are a usage error."""
    if not name:
        return {}
    table = presets(project_dir).get("presets", {})
    if name not in table:
        raise UsageError(f"unknown env_preset '{name}'; known presets: {', '.join(table) or 'none'}")
    return {k: str(v["value"] if isinstance(v, dict) else v) for k, v in (table[name].get("env") or {}).items()}

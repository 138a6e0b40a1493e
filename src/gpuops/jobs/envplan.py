"""The job's environment, planned (pure): the layers (the preset, the profile's env:, ./.env, --env) and which of
their variables are secrets (every .env variable but gpuops' own; a name with TOKEN/KEY/SECRET/PASSWORD/CREDENTIAL
wherever it is given), what is recorded and what only travels in a 0600 file, the presets' known conflicts."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

from ..errors import UsageError


ALWAYS_SECRET = ("WANDB_API_KEY",)
RESERVED = ("GPUOPS_RUN_ID", "GPUOPS_RUN_DIR")
# a variable whose name holds one of these words is a secret wherever it is given (--env, the profile's env:, .env)
SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL")
# .env variables that are gpuops' own, never sent to the job: the Lambda API key and GPUOPS_* settings
OWN_VARIABLES = ("LAMBDA_API_KEY",)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


# -- environment --------------------------------------------------------------------------
@dataclass
class EnvVar:
    name: str
    value: Optional[str]  # None: unset in the job's environment
    origin: str  # "preset h100", "profile", "--env", "gpuops", "--seed"
    reason: str = ""


@dataclass
class EnvPlan:
    vars: dict[str, EnvVar] = field(default_factory=dict)  # plain variables, in order
    secrets: dict[str, str] = field(default_factory=dict)  # name -> value (never printed or recorded)
    secret_origin: dict[str, str] = field(default_factory=dict)
    missing_secrets: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def exported(self) -> dict[str, str]:
        return {k: v.value for k, v in self.vars.items() if v.value is not None}

    @property
    def unset(self) -> list[str]:
        return [k for k, v in self.vars.items() if v.value is None]

    def lines(self) -> list[str]:
        """What is printed before launch: names and values of plain variables, names only of secrets."""
        out = []
        for v in self.vars.values():
            shown = "(unset)" if v.value is None else f"={v.value}"
            why = f"  [{v.origin}{': ' + v.reason if v.reason else ''}]"
            out.append(f"{v.name}{shown}{why}")
        for name in self.secrets:
            out.append(f"{name}=<secret, from {self.secret_origin.get(name, 'local environment')}>")
        return out


def looks_secret(name: str) -> bool:
    """A variable whose value must never be printed or recorded: its name holds TOKEN, KEY, SECRET, PASSWORD or
    CREDENTIAL (any case), or it is WANDB_API_KEY."""
    up = name.upper()
    return name in ALWAYS_SECRET or any(w in up for w in SECRET_WORDS)


def own_variable(name: str) -> bool:
    """gpuops' own settings, read on this machine and never sent to a job (LAMBDA_API_KEY, GPUOPS_*)."""
    return name in OWN_VARIABLES or name.startswith("GPUOPS_")


def recordable_env(env: dict[str, str]) -> dict[str, str]:
    """--env values that may be written to a record or printed: those whose names look secret are left out (a
    record that must relaunch keeps them elsewhere, or asks again)."""
    return {k: v for k, v in env.items() if not looks_secret(k)}


def parse_env_args(items: Iterable[str]) -> dict[str, str]:
    """--env K=V (repeatable). `K=` (empty) unsets K for the job."""
    env: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _NAME.match(key):
            raise UsageError(f"--env {item!r}: expected NAME=VALUE (NAME of letters, digits, _)",
                             hint="use --env NAME= to unset a variable the preset or profile sets")
        env[key] = value
    return env


def load_presets(project_dir: Path | None = None) -> dict:
    """playbooks/presets.yaml: ./playbooks/ of the project overrides the built-in one."""
    try:
        from .. import knowledge

        if hasattr(knowledge, "presets"):
            return knowledge.presets(project_dir) or {}
    except ImportError:
        pass
    import yaml

    from ..paths import data_dir

    local = (project_dir or Path.cwd()) / "playbooks" / "presets.yaml"
    path = local if local.is_file() else data_dir("playbooks") / "presets.yaml"
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return {}
    except yaml.YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML: {exc}") from None


def plan_env(*, preset: Optional[str], presets_doc: dict, profile_env: dict[str, str], cli_env: dict[str, str],
             secret_names: Iterable[str], local_env: dict[str, str], run_id: str, profile_name: str,
             seed: Optional[int] = None, dotenv_names: Iterable[str] = ()) -> EnvPlan:
    """Layer the job's environment: gpuops defaults < preset < profile env < --env < --seed; secrets aside.

    Secrets (sent in a 0600 file, never printed, never in meta.json or launch.sh): WANDB_API_KEY, the profile's
    secrets: names, every variable whose name looks secret (looks_secret) wherever it is given, and every variable
    of the project's .env (dotenv_names: their values from local_env, the real environment winning) but gpuops' own
    (own_variable). A .env variable that the preset, profile env: or --env also sets takes their value (as a plain
    variable unless its name looks secret); over gpuops' defaults (WANDB_RUN_NAME...) the .env value wins."""
    plan = EnvPlan()
    layers: list[tuple[str, str, Optional[str], str]] = [
        ("WANDB_RUN_NAME", run_id, "gpuops", "default: the run id"),
        ("WANDB_RUN_GROUP", profile_name, "gpuops", "default: the profile"),
        ("PYTHONUNBUFFERED", "1", "gpuops", "log lines reach the log as they are printed"),
    ]
    if preset:
        table = (presets_doc or {}).get("presets", {}) or {}
        if preset not in table:
            raise UsageError(f"unknown env_preset '{preset}'; known presets: {', '.join(table) or 'none'}",
                             hint="fix env_preset in the profile, or add the preset to playbooks/presets.yaml")
        for k, spec in ((table[preset] or {}).get("env") or {}).items():
            if isinstance(spec, dict):
                layers.append((k, str(spec.get("value", "")), f"preset {preset}", str(spec.get("reason", ""))))
            else:
                layers.append((k, str(spec), f"preset {preset}", ""))
    for k, v in (profile_env or {}).items():
        layers.append((k, v, "profile", ""))
    for k, v in (cli_env or {}).items():
        layers.append((k, v if v != "" else None, "--env", ""))
    if seed is not None:
        layers.append(("GPUOPS_SEED", str(seed), "--seed", ""))
        layers.append(("PYTHONHASHSEED", str(seed), "--seed", ""))
        if "PYTHONHASHSEED" in (cli_env or {}) or "PYTHONHASHSEED" in (profile_env or {}):
            plan.warnings.append("--seed overrides PYTHONHASHSEED from the profile or --env")

    secrets = list(dict.fromkeys([*ALWAYS_SECRET, *secret_names]))
    dotenv = [n for n in dict.fromkeys(dotenv_names) if not own_variable(n) and n not in RESERVED]
    given = {name for name, _, origin, _ in layers if origin != "gpuops"}
    for name, value, origin, reason in layers:
        if name in RESERVED:
            plan.warnings.append(f"{name} is set by gpuops; the value from {origin} is ignored")
            continue
        if origin == "gpuops" and name in dotenv:
            continue  # the project's .env says otherwise: its value, as a secret
        if name in secrets or looks_secret(name):
            if value:  # a secret given in the profile or --env: still a secret
                plan.secrets[name] = value
                plan.secret_origin[name] = origin
            continue
        plan.vars.pop(name, None)  # later wins, and keeps the later position
        plan.vars[name] = EnvVar(name, value, origin, reason)
    for name in secrets + [n for n in dotenv if n not in given and n not in secrets]:
        if name in plan.secrets:
            continue
        val = local_env.get(name)
        if val is not None and (val or name in dotenv):
            plan.secrets[name] = val
            plan.secret_origin[name] = ".env" if name in dotenv else "local environment"
        elif name not in ALWAYS_SECRET:
            plan.missing_secrets.append(name)
    for name in plan.missing_secrets:
        plan.warnings.append(f"secret {name} is not set in the local environment or .env; the job will not have it")
    return plan


def conflict_warnings(env: dict[str, str], presets_doc: dict, packages: Optional[dict[str, Optional[str]]] = None) -> list[str]:
    """Known conflicts (presets.yaml `conflicts`) that this environment triggers.

    packages: remote package versions (None = not installed); when unknown (None), env alone decides."""
    out = []
    for c in (presets_doc or {}).get("conflicts", []) or []:
        when = c.get("when") or {}
        cond_env = when.get("env") or {}
        if not cond_env or any(env.get(k) != str(v) for k, v in cond_env.items()):
            continue
        note = ""
        for pkg, spec in (when.get("package") or {}).items():
            if packages is None:
                note = f" (if the job uses {pkg} {spec})"
                continue
            ver = packages.get(pkg)
            if not ver or not _version_matches(ver, str(spec)):
                break
            note = f" ({pkg} {ver} is installed)"
        else:
            msg = f"{c.get('message', c.get('id', 'known conflict'))}{note}"
            if c.get("remediation"):
                msg += f"; {c['remediation']}"
            out.append(msg)
    return out


def conflict_packages(presets_doc: dict) -> list[str]:
    names: list[str] = []
    for c in (presets_doc or {}).get("conflicts", []) or []:
        for pkg in ((c.get("when") or {}).get("package") or {}):
            if pkg not in names:
                names.append(pkg)
    return names


def _version_matches(version: str, spec: str) -> bool:
    try:
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version

        return Version(version) in SpecifierSet(spec)
    except Exception:
        return True


def job_env(plan: EnvPlan) -> dict[str, Optional[str]]:
    """The job's plain variables as the launcher sets them (None: unset); the gate's checks run with them."""
    return {k: v.value for k, v in plan.vars.items()}

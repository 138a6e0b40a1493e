"""What a resolution asks uv (ResolveRequest: the requirements, index lines, a lock), the uv commands it runs and
what they print, read (pure): `uv pip compile` for an image's python and platform with its kept packages as
constraints and its others as preferences, `uv export --frozen` of a uv.lock; pylock.toml (versions, wheel sizes),
uv's errors told apart (the cache lacks something offline, no network, no solution)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from .images import norm

if TYPE_CHECKING:
    from .images import Image

# the environment every uv run gets (besides its own cache): no python downloads (uv would try to fetch CPython for
# --python-version and lose seconds on a machine that cannot), no progress bars, one retry
UV_ENV = {"UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1", "UV_HTTP_RETRIES": "1", "NO_COLOR": "1"}


# -- what uv is asked -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ResolveRequest:
    """What to resolve. uv runs in a folder of its own: a path in a requirement or an index line (`-e .`,
    `./wheels/x.whl`, `--find-links wheels`) must be absolute; a requirement uv cannot find or fetch here (a git URL
    without network, a package on the instance's own index) makes the resolution unavailable, never a refusal."""
    requirements: tuple[str, ...]      # PEP 508 strings, includes already followed, extras chosen, PEP 723 added
    index_lines: tuple[str, ...]       # --index-url / --extra-index-url / --find-links lines as the files gave them
    lock: Optional[str] = None         # path of a uv.lock to export instead of resolving (frozen)
    extras: tuple[str, ...] = ()       # for the lock/pyproject case


@dataclass
class Run:
    """One uv command to run in a work folder: its argv (after `uv`), the files to write first, where its output is."""
    key: str
    argv: list[str]
    files: dict[str, str] = field(default_factory=dict)
    output: Optional[str] = None


@dataclass
class Outcome:
    """What one run gave."""
    rc: Optional[int]            # None: it did not finish within the time it was given
    stdout: str = ""
    stderr: str = ""
    output: Optional[str] = None  # the output file's text
    seconds: float = 0.0
    online: bool = False
    sizes: dict[str, int] = field(default_factory=dict)  # file:// URL -> bytes (local wheels: pylock has no size)


def requirement_name(text: str) -> Optional[str]:
    """The normalized name of a PEP 508 requirement (None for a path, a URL without a name, an option)."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", text)
    if not m or text.lstrip().startswith(("-", ".", "/")):
        return None
    return norm(m.group(1))


def relaxed(requirement: str) -> str:
    """A requirement with its version specifier left out (`bigtrainer[x]>=2 ; marker` -> `bigtrainer[x] ; marker`)."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*(?:\[[^\]]*\])?)\s*([^;@]*)(;.*)?$", requirement)
    if not m:
        return requirement
    return m.group(1) + (f" {m.group(3)}" if m.group(3) else "")


def requirements_in(request: "ResolveRequest", requirements: Optional[tuple[str, ...]] = None) -> str:
    """The input file uv resolves: the files' index lines, then the requirements."""
    lines = [ln.strip() for ln in request.index_lines if ln.strip()]
    lines += [r.strip() for r in (request.requirements if requirements is None else requirements) if r.strip()]
    return "\n".join(lines) + "\n"


def constraints_text(image: "Image", stub_urls: dict[str, str]) -> str:
    """The image's kept packages as constraints: each the image's own distribution (a metadata-only wheel of its
    name and version, with no dependencies: the image brings them), so any requirement on another version
    conflicts, and none of what PyPI's build of it requires (nvidia-* wheels) is resolved."""
    return "".join(f"{n} @ {stub_urls[n]}\n" if n in stub_urls else f"{n}=={image.packages[n]}\n"
                   for n in sorted(image.keep) if n in image.packages)


def preferences_text(image: "Image", *, kept_too: bool = False) -> str:
    """A pylock.toml holding the image's other packages: uv prefers the versions of an existing output file, as pip
    keeps an installed version that satisfies a requirement."""
    names = sorted(n for n in image.packages if kept_too or n not in image.keep)
    body = "".join(f'\n[[packages]]\nname = "{n}"\nversion = "{public(image.packages[n])}"\n' for n in names)
    return f'lock-version = "1.0"\ncreated-by = "uv"\nrequires-python = ">={image.python_minor}"\n{body}'


def public(version: str) -> str:
    """A version without its local label (2.9.0+cu128 -> 2.9.0)."""
    return str(version).split("+", 1)[0]


def compile_run(key: str, request: "ResolveRequest", image: "Image", *, constrained: bool,
                requirements: Optional[tuple[str, ...]] = None, stub_urls: Optional[dict[str, str]] = None,
                python: Optional[str] = None) -> Run:
    """`uv pip compile` for the image's python and platform: pylock.toml out (it carries each wheel's size).
    `python`: an interpreter of this machine for the builds a resolution needs (an sdist's metadata); naming it
    spares uv a search of PATH for a python of the image's version (1.5 s here)."""
    files = {"requirements.in": requirements_in(request, requirements)}
    if any(n not in image.keep for n in image.packages):  # uv refuses a pylock.toml without packages
        files[f"pylock.{key}.toml"] = preferences_text(image)
    argv = ["pip", "compile", "--quiet", "--python-version", image.python or "3.10", "--python-platform",
            image.platform, "--format", "pylock.toml", "--output-file", f"pylock.{key}.toml", "--no-header"]
    if python:
        argv += ["--python", python]
    if any(re.match(r"--extra-index-url\b", ln.strip()) for ln in request.index_lines):
        argv += ["--index-strategy", "unsafe-best-match"]  # pip's way with several indexes: the best version of all
    if constrained and image.keep:
        files["constraints.txt"] = constraints_text(image, stub_urls or {})
        argv += ["--constraint", "constraints.txt"]
    argv.append("requirements.in")
    return Run(key, argv, files, f"pylock.{key}.toml")


def export_run(request: "ResolveRequest") -> Run:
    """`uv export --frozen` of a uv.lock: what it installs, in its folder, without resolving."""
    import os

    folder = os.path.dirname(os.path.abspath(request.lock or "uv.lock"))
    argv = ["export", "--frozen", "--no-emit-project", "--no-hashes", "--no-header", "--format", "requirements.txt",
            "--directory", folder] + [a for e in request.extras for a in ("--extra", e)]
    return Run("export", argv)


# -- what uv said -----------------------------------------------------------------------------------------------------
def resolved_of(outcome: Outcome, arch: str = "x86_64") -> dict[str, tuple[str, Optional[int], str]]:
    """parse_pylock of a run's output, the sizes of local wheels filled in."""
    got = parse_pylock(outcome.output, arch)
    return {n: (v, s if s is not None else outcome.sizes.get(u), u) for n, (v, s, u) in got.items()}


def parse_pylock(text: Optional[str], arch: str = "x86_64") -> dict[str, tuple[str, Optional[int], str]]:
    """name -> (version, bytes of the wheel this machine would take or None, url or '') of a pylock.toml."""
    if not text:
        return {}
    try:
        import tomllib
    except ImportError:  # Python 3.10: the name/version/size lines, by pattern
        return _parse_pylock_lines(text)
    try:
        doc = tomllib.loads(text)
    except ValueError:
        return {}
    out = {}
    for p in doc.get("packages") or []:
        name, version = norm(p.get("name", "")), str(p.get("version") or "")
        wheels = [w for w in p.get("wheels") or [] if isinstance(w, dict)]
        url = str((p.get("archive") or p.get("directory") or {}).get("url") or "") if not wheels else ""
        size, wurl = _wheel_for(wheels, arch)
        if not version:
            m = re.search(r"-(\d[^-]*)-", wurl.rsplit("/", 1)[-1]) if wurl else None
            version = m.group(1) if m else ""
        out[name] = (version, size, wurl or url)
    return out


def _parse_pylock_lines(text: str) -> dict[str, tuple[str, Optional[int], str]]:
    out, name, version = {}, None, ""
    for block in text.split("[[packages]]")[1:]:
        m = re.search(r'(?m)^name = "([^"]+)"', block)
        v = re.search(r'(?m)^version = "([^"]+)"', block)
        s = re.findall(r"size = (\d+)", block)
        u = re.search(r'url = "([^"]+)"', block)
        if m:
            name, version = norm(m.group(1)), v.group(1) if v else ""
            out[name] = (version, max(map(int, s)) if s else None, u.group(1) if u else "")
    return out


def _wheel_for(wheels: list[dict], arch: str) -> tuple[Optional[int], str]:
    """(size, url) of the wheel an instance of `arch` takes: a Linux wheel of its machine, else a pure one."""
    machine = "aarch64" if arch in ("arm64", "aarch64") else "x86_64"
    named = [(str(w.get("url") or w.get("name") or w.get("path") or ""), w.get("size")) for w in wheels]
    linux = [x for x in named if "linux" in x[0] and machine in x[0]]
    pure = [x for x in named if x[0].endswith("-none-any.whl")]
    pick = (linux or pure or named or [("", None)])[0]
    return (int(pick[1]) if pick[1] is not None else None), pick[0]


def parse_export(text: str, image: "Image") -> dict[str, str]:
    """name -> version of `uv export`'s requirements, those whose marker holds on the image."""
    from packaging.requirements import InvalidRequirement, Requirement

    env = marker_env(image)
    out = {}
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith(("#", "-")):
            continue
        try:
            r = Requirement(line)
        except InvalidRequirement:
            continue
        if r.marker is not None and not r.marker.evaluate(env):
            continue
        pinned = [s.version for s in r.specifier if s.operator in ("==", "===")]
        out[norm(r.name)] = pinned[0] if pinned else (r.url or "")
    return out


def marker_env(image: "Image") -> dict:
    from packaging.markers import default_environment

    machine = "aarch64" if image.arch == "arm64" else "x86_64"
    return {**default_environment(), "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": machine, "python_version": image.python_minor,
            "python_full_version": image.python or image.python_minor, "implementation_name": "cpython",
            "platform_python_implementation": "CPython", "extra": ""}


OFFLINE_MISS = re.compile(r"not found in the cache|network was disabled|Network connectivity is disabled|"
                          r"wasn't found in the cache|--offline", re.I)
NO_SOLUTION = re.compile(r"No solution found when resolving|unsatisfiable|cannot be used", re.I)
NETWORK = re.compile(r"Request failed after|error sending request|dns error|Name or service not known|"
                     r"Connection refused|tcp connect error|timed out|Failed to fetch|certificate", re.I)


def classify(outcome: Outcome) -> str:
    """ok | timeout | offline-miss | no-solution | network | other."""
    if outcome.rc is None:
        return "timeout"
    if outcome.rc == 0:
        return "ok"
    err = outcome.stderr
    if not outcome.online and OFFLINE_MISS.search(err):
        return "offline-miss"
    if NETWORK.search(err) and not NO_SOLUTION.search(err):
        return "network"
    if NO_SOLUTION.search(err):
        return "no-solution"
    return "other"


def uv_cause(stderr: str, limit: int = 400) -> str:
    """uv's reason in one line: its `cause:` (or `error:`) text, whitespace folded, the hints left out."""
    text = re.sub(r"(?m)^warning: .*$", "", stderr)
    m = re.search(r"cause:(.*?)(?:\n\s*hint:|\Z)", text, re.S) or re.search(r"error:(.*?)(?:\n\s*hint:|\Z)", text, re.S)
    said = re.sub(r"\s+", " ", (m.group(1) if m else text)).strip()
    return said if len(said) <= limit else said[: limit - 3].rstrip() + "..."


def first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("warning:")]
    return lines[0][:300] if lines else ""

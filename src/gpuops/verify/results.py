"""A check's outcome and the version rules every judge of a host shares (checks, rules, bench, setup's plan): the
statuses, CheckResult, and how a version matches what a profile expects. Pure; below every module that judges, so
none of them imports another to reach these."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

PASS, WARN, FAIL, INFO = "pass", "warn", "fail", "info"
TORCH_INDEX = "https://download.pytorch.org/whl/{tag}"  # used when knowledge.yaml has no torch_index
AREAS = {"system": "System", "gpu": "GPU", "python": "Python", "packages": "Packages", "cuda": "CUDA runtime",
         "env": "Environment", "user": "Your checks", "bench": "Benchmark (--bench)"}


@dataclass
class CheckResult:
    id: str
    title: str
    status: str
    measured: str | None = None
    expected: str | None = None
    remediation: str | None = None
    detail: str | None = None

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["area"] = self.area
        return d


# -- versions ------------------------------------------------------------------------------
def _parse_version(text: str):
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text)
    except InvalidVersion:
        m = re.match(r"[\d.]+", text or "")
        return Version(m.group(0).strip(".")) if m and m.group(0).strip(".") else None


def spec_matches(version: str | None, spec: str) -> bool | None:
    """True/False, or None when the specifier is invalid. A bare version means 'this release or a patch of it'
    ("12.8" matches 12.8 and 12.8.1; "2.9.0" matches 2.9.0+cu128); "*" means installed."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if version is None:
        return False
    spec = spec.strip()
    if spec in ("*", ""):
        return True
    v = _parse_version(version)
    if v is None:
        return False
    if spec[0].isdigit():
        if "+" in spec:
            return version == spec
        want = _parse_version(spec)
        if want is None:
            return None
        n = len(want.release)
        return v.release[:n] == want.release
    try:
        return SpecifierSet(spec, prereleases=True).contains(v, prereleases=True)
    except InvalidSpecifier:
        return None


def major_minor(version: str | None) -> str | None:
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def cuda_tag(cuda: str | None) -> str | None:
    mm = major_minor(cuda)
    return "cu" + mm.replace(".", "") if mm else None


def local_tag(version: str | None) -> str | None:
    return version.split("+", 1)[1] if version and "+" in version else None



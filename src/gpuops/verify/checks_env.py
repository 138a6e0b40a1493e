"""The environment checks (pure): variables that conflict with the preset, and the user's own remote checks."""
from __future__ import annotations

import re
from typing import Iterable

from .checks_context import Context
from .results import CheckResult, FAIL, PASS, WARN, spec_matches


def check_env_conflicts(c: Context) -> Iterable[CheckResult]:
    sources = [("remote environment", c.f.env), (f"preset '{c.p.env_preset}'", c.preset_env), ("profile env", c.p.env)]
    for conflict in c.presets.get("conflicts", []) or []:
        when = conflict.get("when", {})
        hits = []
        for label, env in sources:
            if all(_env_has(env.get(k), v) for k, v in (when.get("env") or {}).items()):
                hits.append(label)
        pkg_ok = True
        for name, spec in (when.get("package") or {}).items():
            have = c.installed(name)
            expected = c.e.packages.get(name)
            pkg_ok = pkg_ok and (spec_matches(have, spec) if have else bool(expected and spec_matches(expected.lstrip("=<>~ "), spec)))
        if hits and pkg_ok:
            yield CheckResult(f"env.{conflict['id']}", "known conflict", WARN, f"set in {', '.join(hits)}",
                              remediation=conflict.get("remediation"), detail=f"{conflict['message']} (source: {conflict.get('source')})")


def _env_has(value: str | None, want: str) -> bool:
    return value is not None and (value == want or want in value.split(","))


def check_user(c: Context) -> Iterable[CheckResult]:
    for spec in c.pb.get("user_checks") or []:
        if "{pip_install}" in (spec.get("remediation") or ""):
            spec = dict(spec, remediation=spec["remediation"].replace("{pip_install}", c.pip_install))
        name = spec["name"]
        res = c.f.user_checks.get(name)
        sev = FAIL if spec.get("severity", "fail") == "fail" else WARN
        cid = "user." + re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
        if res is None or not res.get("ok"):
            yield CheckResult(cid, name, sev, "did not run", detail=(res or {}).get("error"), remediation=spec.get("remediation"))
            continue
        r = res["value"]
        if r.get("timeout"):
            yield CheckResult(cid, name, sev, "timed out", remediation=spec.get("remediation"))
            continue
        out = (r.get("stdout") or "") + (r.get("stderr") or "")
        problems = []
        if r.get("rc") != spec.get("expect_exit", 0):
            problems.append(f"exit {r.get('rc')} (expected {spec.get('expect_exit', 0)})")
        if "expect_contains" in spec and spec["expect_contains"] not in out:
            problems.append(f"output lacks {spec['expect_contains']!r}")
        if "expect_regex" in spec and not re.search(spec["expect_regex"], out, re.MULTILINE):
            problems.append(f"output does not match /{spec['expect_regex']}/")
        first = next((ln.strip() for ln in out.splitlines() if ln.strip()), "")
        yield CheckResult(cid, name, sev if problems else PASS, first[:80] or f"exit {r.get('rc')}",
                          detail="; ".join(problems) or None, remediation=spec.get("remediation") if problems else None)

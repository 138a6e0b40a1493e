"""The local plan's verdict (Plan: refusals, warnings, hints, and what it was built from; ModuleVerdict: one module's),
and the verdict said and enforced: its summary, warnings and hints through the command's Output, its refusals as
one ChecksFailed (exit 1) with every fix, before anything is launched, synced or installed. `run`, `train`, `setup`
and `plan` all go through here, so they say the same plan in the same words."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from .resolution import Resolution


@dataclass
class ModuleVerdict:
    module: str
    needed_by: str
    status: str  # stdlib | project | image | installed | torch | setup | missing | elsewhere | unknown
    provider: str = ""  # the distribution that provides it, as far as the plan knows

    def to_json(self) -> dict:
        return {"module": self.module, "needed_by": self.needed_by, "status": self.status,
                "provider": self.provider or None}


@dataclass
class Plan:
    """The local plan's verdict, and what it was built from."""
    script: str
    image: Optional[str] = None
    python: Optional[str] = None
    runs: list[dict] = field(default_factory=list)
    scripts: list[str] = field(default_factory=list)
    files: int = 0
    depth: int = 0
    modules: list[ModuleVerdict] = field(default_factory=list)
    declared: list[str] = field(default_factory=list)  # the requirements the resolution was asked for
    index_lines: list[str] = field(default_factory=list)
    resolution: Optional[Resolution] = None
    refusals: list[tuple[str, str]] = field(default_factory=list)  # (problem, fix)
    certain: list[tuple[str, str]] = field(default_factory=list)  # refusals no --force passes (no host runs them)
    warnings: list[str] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    seconds: float = 0.0
    prep: Optional[str] = None  # the --prep command judged with the job
    script_blocks: list[str] = field(default_factory=list)  # the scripts whose `# /// script` block setup installs
    installs: list[tuple[str, str]] = field(default_factory=list)  # (file, requirement): what setup installs

    @property
    def refused(self) -> bool:
        return bool(self.refusals or self.certain)

    def to_json(self) -> dict:
        r = self.resolution
        res = r.to_dict() if r is not None else None  # setup installs its pins (setup/pinned.py)
        return {"script": self.script, "image": self.image, "python": self.python, "runs": self.runs,
                "scripts": self.scripts, "files_read": self.files, "import_depth": self.depth,
                "modules": [m.to_json() for m in self.modules], "requirements": self.declared,
                "index_lines": self.index_lines, "resolution": res,
                "refusals": [{"problem": p, "fix": f} for p, f in self.certain + self.refusals],
                "warnings": self.warnings, "hints": self.hints, "verdict": "refuse" if self.refused else "launch",
                "seconds": round(self.seconds, 3), "prep": self.prep, "script_blocks": self.script_blocks,
                "installs": [{"requirement": line, "from": src} for src, line in self.installs]}


def _gb(n) -> str:
    return f"{n / 1e9:.2f} GB" if n is not None else "size unknown"


def summary(plan: "Plan") -> str:
    """One line: what was read, and what the resolution found."""
    parts = [f"{len(plan.scripts) or 1} script(s), {plan.files} python file(s) read (imports {plan.depth} deep)",
             f"{len([m for m in plan.modules if m.status not in ('stdlib', 'project')])} module(s) judged"]
    r = plan.resolution
    if r is not None and r.available:
        parts.append(f"setup installs {len(r.packages)} package(s), {_gb(r.install_bytes)}, resolved for "
                     f"{plan.image} in {r.seconds:.1f} s")
    elif r is not None:
        parts.append(f"not resolved ({r.why or 'unavailable'})")
    what = plan.script + (f" (and --prep {plan.prep})" if plan.prep else "")
    return f"local plan for {what}" + (f" on {plan.image}" if plan.image else "") + ": " + "; ".join(parts) + \
        f" ({plan.seconds:.1f} s)"


def report(plan: "Plan", out, *, quiet: bool = False) -> None:
    """The plan's summary line (unless quiet), its warnings and hints, through `out` (stderr; nothing in JSON)."""
    if not quiet:
        out.info(summary(plan))
    for w in plan.warnings:
        out.warn(w)
    for h in plan.hints:
        out.info(h)


def enforce(plan: "Plan", *, force: bool, done: str, out=None) -> None:
    """Refuse what the plan refuses: ChecksFailed (exit 1) naming every problem, the fixes as the hint. `done` says
    what was not done ("nothing was launched"). With force, the refusals a --force may pass (a torch another than the
    image's, a module this machine's resolution does not find) become warnings; the certain ones (what no host runs)
    never do."""
    from ..errors import ChecksFailed

    refusals = list(plan.certain)
    if force and plan.refusals and out is not None:
        for p, _ in plan.refusals:
            out.warn(f"{p} (--force: going on anyway)")
    elif not force:
        refusals += plan.refusals
    if refusals:
        hint = "\n".join(f for _, f in refusals)
        if plan.refusals and not force and not plan.certain:
            hint += "\nto go on anyway: --force"
        raise ChecksFailed("; ".join(p for p, _ in refusals) + f"; {done}", hint=hint)

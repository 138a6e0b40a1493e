"""A resolution of the project's requirements for an image, made on this machine before anything is launched (pure
but for `resolve`, which hands the uv runs to project/uvrun.py).

uv's resolver (`uv pip compile`) answers for the instance: the image's python version and platform (images.yaml),
the image's kept packages (its CUDA torch) as constraints, its other packages as preferences (pip keeps an installed
version that satisfies a requirement). A second resolution without the constraints says what pip alone would do:

- the same torch: nothing to say;
- another torch (an unpinned torchvision whose newest release needs a newer torch, with its CUDA libraries), and the
  constrained resolution succeeded: the plan installs the constrained one and says so (`fixes`: "torchvision 0.24.0
  matches the image's torch 2.9.0"), and what pip would have replaced (`replaces_image`);
- no resolution keeps the image's torch (`torch==2.10`, a package whose every release needs a newer torch): a
  `refusal` with the pin that works, found by resolving again with the offending requirements' versions left free;
- a direct requirement that did not get its newest version to keep the image's torch is said too.

A uv.lock is not resolved but exported (`uv export --frozen`): the lock decides. Packages that build against torch
(playbooks/builds.yaml) get a prebuilt wheel or a build with --no-build-isolation against the image's torch
(`builds`). When no resolution can be made here (no uv, no network for what the cache lacks, a timeout), the
Resolution is `available=False` with `why`, and the plan falls back: a resolution never blocks a launch by itself.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from .images import norm
from .uvcmd import (Outcome, ResolveRequest, classify, compile_run, export_run, marker_env, parse_export, public,
                    relaxed, requirement_name, resolved_of, uv_cause)

if TYPE_CHECKING:
    from .images import Image

@dataclass
class Resolution:
    available: bool                    # False: no resolution (offline, timeout, uv missing): `why` says, fall back
    why: str = ""
    packages: dict[str, str] = field(default_factory=dict)   # normalized name -> version: what setup installs
    install_bytes: Optional[int] = None
    replaces_image: list[tuple[str, str, str]] = field(default_factory=list)  # (name, image version, new version)
    fixes: list[str] = field(default_factory=list)           # what the plan changed and why
    refusal: Optional[tuple[str, str]] = None                # (message, fix) when no fix exists
    builds: list[dict] = field(default_factory=list)         # packages that build against torch: name, how, why
    seconds: float = 0.0
    # besides the interface: the whole resolved set (the image's packages included: what the job's python will
    # have), which image it was made for, and how (offline from the cache, or online)
    resolved: dict[str, str] = field(default_factory=dict)
    image: str = ""
    how: str = ""

    def pins(self) -> str:
        """The constraints setup installs with (`-c`): every resolved version, the image's kept packages included
        (so pip can neither replace them nor pick another version of anything the plan resolved)."""
        return "".join(f"{n}=={v}\n" for n, v in sorted(self.resolved.items()))

    def to_dict(self) -> dict:
        return {"available": self.available, "why": self.why, "image": self.image, "how": self.how,
                "packages": dict(sorted(self.packages.items())), "install_bytes": self.install_bytes,
                "replaces_image": [list(r) for r in self.replaces_image], "fixes": list(self.fixes),
                "refusal": list(self.refusal) if self.refusal else None, "builds": list(self.builds),
                "seconds": round(self.seconds, 3),
                # what setup installs with (setup/pinned.py): every resolved version, the image's included
                "pins": dict(sorted(self.resolved.items())) if self.available and not self.refusal else {}}

    def lines(self) -> list[str]:
        """The resolution as the plan shows it."""
        if not self.available:
            return [f"resolution: none ({self.why})"]
        size = f", {human_bytes(self.install_bytes)}" if self.install_bytes is not None else ""
        names = ", ".join(f"{n} {v}" for n, v in sorted(self.packages.items())) or "nothing"
        out = [f"resolution for {self.image} ({self.how}, {self.seconds:.1f} s): setup installs {len(self.packages)} "
               f"package(s){size}: {names}"]
        out += [f"  fixed: {f}" for f in self.fixes]
        out += [f"  builds: {b['name']} {b['version']}: {b['why']}" for b in self.builds]
        if self.refusal:
            out += [f"  REFUSED: {self.refusal[0]}", f"  fix: {self.refusal[1]}"]
        return out


def human_bytes(n: Optional[int]) -> str:
    if n is None:
        return "size unknown"
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"




PIP = "pip alone"
COMPANIONS = ("torchvision", "torchaudio")  # who would install the unconstrained resolution: setup's installer without the plan's pins


# -- the resolution ---------------------------------------------------------------------------------------------------
def resolve(request: ResolveRequest, image: "Image", *, timeout_s: float = 20.0) -> Resolution:
    """The resolution of `request` for `image`, within `timeout_s` (uv runs offline from gpuops' cache first, then
    online for what the cache lacks, in the time left). Never raises for uv's or the network's sake: a resolution
    that cannot be made is `available=False` with `why`."""
    import time

    t0 = time.monotonic()
    try:
        res = _resolve(request, image, timeout_s, t0)
    except OSError as exc:  # uv could not be started, the work folder could not be written
        res = Resolution(False, why=f"uv could not run here: {exc}")
    res.seconds = time.monotonic() - t0
    res.image = image.label
    return res


def direct_pins(request: ResolveRequest, image: "Image") -> list[tuple[str, str]]:
    """(requirement, kept version) of each requirement on a kept package that its version does not meet
    (`torch==2.10` on an image whose torch is 2.9.0+cu128): known from the files, without a resolution."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    out = []
    for text in request.requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        name = norm(req.name)
        if name not in image.keep or name not in image.packages or not str(req.specifier):
            continue
        if req.marker is not None and not req.marker.evaluate(marker_env(image)):
            continue
        try:
            ok = req.specifier.contains(Version(image.packages[name]), prereleases=True)
        except InvalidVersion:
            continue
        if not ok:
            out.append((text.strip(), image.packages[name]))
    return out


def pin_refusal(image: "Image", pins: list[tuple[str, str]], how: str) -> Resolution:
    """The refusal of a requirement that pins a kept package to another version (no resolution needed)."""
    said = ", ".join(f"`{req}`" for req, _ in pins)
    name = requirement_name(pins[0][0]) or "torch"
    version = public(re.split(r"[=<>~!]+", pins[0][0])[-1].split(";")[0].strip())
    return Resolution(True, how=how, refusal=(
        f"the requirements pin {said}, and the image's {name} is {pins[0][1]} ({image.label}): setup would install "
        f"another {name} over it (with its own CUDA libraries, several GB), and the job would not use the image's",
        f"drop the pin so the job uses the image's {name} {pins[0][1]}, or install {name} {version} on purpose: "
        f"expect.packages: {{{name}: \"{version}\"}} in the profile (setup installs it for the driver's CUDA, and "
        "the plan resolves against it)"))


def _resolve(request: ResolveRequest, image: "Image", timeout_s: float, t0: float) -> Resolution:
    import sys
    import tempfile
    from pathlib import Path

    from . import uvrun

    pins = direct_pins(request, image) if not request.lock else []
    if pins:  # known from the files alone: no uv, no network
        return pin_refusal(image, pins, "the requirements as written (no resolution needed)")
    uv = uvrun.find_uv()
    if uv is None:
        return Resolution(False, why="uv is not on this machine's PATH (docs.astral.sh/uv installs it), so the plan "
                                     "cannot resolve the project here: today's checks judge it instead")
    kept = {n: image.packages[n] for n in image.keep if n in image.packages}
    if not request.lock and not request.requirements:
        return Resolution(True, resolved=dict(image.packages), how="nothing to resolve")
    with tempfile.TemporaryDirectory(prefix="gpuops-resolve-") as tmp:
        work = Path(tmp)
        if request.lock:
            out = _run(uv, [export_run(request)], work, t0, timeout_s)["export"]
            return from_export(out, image, builds_rows())
        stubs = uvrun.image_stubs(image) if kept else {}
        py = sys.executable
        runs = [compile_run("constrained", request, image, constrained=True, stub_urls=stubs, python=py)]
        if kept:
            runs.append(compile_run("unconstrained", request, image, constrained=False, python=py))
        outs = _run(uv, runs, work, t0, timeout_s)
        c = outs["constrained"]
        if kept and classify(c) == "no-solution":
            again = relax_for(request, image, c.stderr)
            if again is not None:
                more = _run(uv, [compile_run("relaxed", request, image, constrained=True, requirements=again,
                                             stub_urls=stubs, python=py)], work, t0, timeout_s)
                outs.update(more)
        return judge(request, image, outs, builds_rows(), cuda_drivers())


def _run(uv: str, runs: list, work, t0: float, timeout_s: float) -> dict:
    """Every run offline first; those the cache cannot answer again online, in the time left."""
    import time

    from . import uvrun

    left = lambda: timeout_s - (time.monotonic() - t0)  # noqa: E731
    outs = uvrun.run_all(uv, runs, work, timeout_s=left(), offline=True)
    again = [r for r in runs if classify(outs[r.key]) == "offline-miss"]
    if again and left() > 0.5:
        outs.update(uvrun.run_all(uv, again, work, timeout_s=left(), offline=False))
    return outs


def builds_rows() -> list[dict]:
    from ..knowledge import load_playbook

    return [r for r in load_playbook("builds").get("builds") or [] if isinstance(r, dict) and r.get("name")]


def cuda_drivers() -> list[dict]:
    from ..knowledge import knowledge

    return [r for r in knowledge().get("cuda_drivers") or [] if isinstance(r, dict)]



# -- the judgement (pure: what uv said -> a Resolution) ---------------------------------------------------------------
def judge(request: ResolveRequest, image: "Image", outs: dict[str, Outcome], rows: list[dict],
          drivers: list[dict]) -> Resolution:
    """The Resolution of the constrained run (`constrained`), compared with what pip alone would do
    (`unconstrained`), with the pin that works (`relaxed`) when no resolution keeps the image's torch."""
    c, u = outs["constrained"], outs.get("unconstrained")
    kind = classify(c)
    how = "online" if c.online else "offline, from gpuops' uv cache"
    if kind in ("timeout", "network", "offline-miss", "other"):
        return Resolution(False, why=unavailable_why(kind, c))
    if kind == "no-solution":
        return refuse(request, image, c, u, outs.get("relaxed"), drivers, how)
    got = resolved_of(c, image.arch)
    resolved = {n: (image.packages[n] if n in image.keep else v) for n, (v, _, _) in got.items()}
    packages = {n: v for n, v in resolved.items() if not same(image.packages.get(n), v)}
    sizes = [got[n][1] for n in packages if n in got]
    res = Resolution(True, packages=packages, resolved={**image.packages, **resolved}, how=how,
                     install_bytes=sum(s for s in sizes if s is not None) if any(s is not None for s in sizes) else
                     (0 if not packages else None))
    torch_env = resolved.get("torch") or image.torch
    res.builds = decide_builds(got, image, rows, torch_env)
    if u is not None and classify(u) == "ok":
        compare(request, image, res, resolved_of(u, image.arch), drivers)
    return res


def same(image_version: Optional[str], version: str) -> bool:
    """The image's version is the resolved one (2.9.0+cu128 is 2.9.0)."""
    return bool(image_version) and (image_version == version or public(image_version) == public(version))


def decide_builds(got, image: "Image", rows: list[dict], torch: Optional[str]) -> list[dict]:
    from .builds import decide

    return decide(got, image, rows, torch)


def compare(request: ResolveRequest, image: "Image", res: Resolution, alone: dict, drivers: list[dict]) -> None:
    """What pip alone would have installed instead: a kept package replaced (said, with what the plan installs
    instead), a direct requirement held back to an older release to keep the image's torch (said)."""
    mine = dict(res.resolved)
    # pip keeps an installed torch that satisfies every requirement: a newer torch in the resolution without the
    # constraints is pip's only where a package was held back to keep the image's (an unpinned torchvision)
    held = [n for n in alone if n not in image.keep and n in mine and older(mine[n], alone[n][0])]
    replaced = [(n, image.packages[n], alone[n][0]) for n in sorted(image.keep)
                if held and n in image.packages and n in alone and not same(image.packages[n], alone[n][0])]
    res.replaces_image = replaced
    direct = [n for n in (requirement_name(r) for r in request.requirements) if n]
    torch = image.packages.get("torch", "")
    for n in dict.fromkeys(direct):
        if n in image.keep or n not in alone or n not in mine or mine[n] == alone[n][0]:
            continue
        if not older(mine[n], alone[n][0]):
            continue
        if replaced:
            verb = "matches" if n in COMPANIONS else "works with"
            res.fixes.append(f"{n} {mine[n]} {verb} the image's torch {torch}: unpinned, {PIP} would take {n} "
                             f"{alone[n][0]}, which comes with torch {alone.get('torch', ('?',))[0]}")
        else:
            res.fixes.append(f"{n} {mine[n]}, not its newest release {alone[n][0]}: held back by the image's "
                             f"packages ({', '.join(f'{k} {v}' for k, v in sorted(image.packages.items()))})")
    others = [n for n in sorted(held) if n not in direct]
    if replaced and others:  # pulled in by a requirement (llama-cookbook: unstructured[pdf] -> timm -> torchvision)
        res.fixes.append(f"the plan keeps the image's torch {torch} with " + ", ".join(
            f"{n} {mine[n]} (not {alone[n][0]})" for n in others[:8]) + (", ..." if len(others) > 8 else ""))
    if replaced:
        res.fixes.append(pip_would(image, alone, replaced, drivers) + "; the plan's pins keep the image's")


def older(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) < Version(b)
    except InvalidVersion:
        return False


def pip_would(image: "Image", alone: dict, replaced: list, drivers: list[dict]) -> str:
    """`pip alone would install torch 2.14.1 with CUDA 13.0 libraries (3.05 GB) over the image's torch 2.9.0+cu128
    (CUDA 13.0 needs driver 580 or newer)`."""
    extra = sum(s or 0 for n, (v, s, _) in alone.items() if not same(image.packages.get(n), v))
    cuda = cuda_of(alone)
    what = ", ".join(f"{n} {new}" for n, _, new in replaced)
    over = ", ".join(f"{n} {old}" for n, old, _ in replaced)
    need = driver_for(cuda, drivers)
    return (f"{PIP} would install {what}" + (f" with CUDA {cuda} libraries" if cuda else "")
            + (f" ({human_bytes(extra)})" if extra else "") + f" over the image's {over}, which it would shadow"
            + (f" (CUDA {cuda} needs driver {need} or newer)" if need else ""))


def cuda_of(packages: dict) -> Optional[str]:
    """The CUDA a resolved set brings: its nvidia-cuda-runtime wheel (13.0.96 -> 13.0), else torch's +cuXYZ."""
    for n, (v, _, _) in sorted(packages.items()):
        if n.startswith("nvidia-cuda-runtime"):
            return ".".join(v.split(".")[:2])
    m = re.search(r"\+cu(\d+)(\d)$", (packages.get("torch") or ("",))[0])
    return f"{m.group(1)}.{m.group(2)}" if m else None


def driver_for(cuda: Optional[str], drivers: list[dict]) -> Optional[str]:
    """The driver a CUDA major needs (knowledge.yaml cuda_drivers: the first release of that major's floor)."""
    if not cuda:
        return None
    rows = [r for r in drivers if str(r.get("cuda", "")).split(".")[0] == cuda.split(".")[0]]
    floor = min((str(r.get("minor_compat") or r.get("toolkit")) for r in rows), default=None,
                key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)))
    return floor.split(".")[0] if floor else None


def unavailable_why(kind: str, c: Outcome) -> str:
    said = uv_cause(c.stderr, 240)
    if kind == "timeout":
        return (f"uv did not finish within {c.seconds:.0f} s (a cold cache, a slow index): the plan judges without "
                "a resolution")
    if kind == "network":
        return f"this machine cannot reach the package index ({said}): the plan judges without a resolution"
    if kind == "offline-miss":
        return "gpuops' uv cache lacks what the resolution needs, and there was no time left to fetch it"
    return f"uv could not resolve the project here ({said}): the plan judges without a resolution"


def mentioned(name: str, text: str) -> bool:
    pattern = re.sub(r"[-_.]", "[-_.]", re.escape(name).replace("\\-", "-"))
    return re.search(rf"(?<![\w.-]){pattern}(?![\w-])", text, re.I) is not None


def relax_for(request: ResolveRequest, image: "Image", stderr: str) -> Optional[tuple[str, ...]]:
    """The requirements with the versions of those uv's conflict names left free (all of them when it names none),
    to find the releases that work with the image's torch; None when nothing would change."""
    cause = uv_cause(stderr, 100000)
    named = [r for r in request.requirements if (requirement_name(r) or "") and mentioned(requirement_name(r), cause)]
    targets = set(named or request.requirements)
    out = tuple(relaxed(r) if r in targets else r for r in request.requirements)
    return out if out != tuple(request.requirements) else None


MISSING = re.compile(r"(?:there is no version of|no versions of)\s+([A-Za-z0-9][A-Za-z0-9._-]*)|"
                     r"([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the (?:package registry|provided package locations|"
                     r"cache)", re.I)


def missing_names(stderr: str) -> list[str]:
    """Packages uv's conflict says the indexes do not have (at all, or at the version asked)."""
    return [norm(a or b) for a, b in MISSING.findall(uv_cause(stderr, 100000))]


def refuse(request: ResolveRequest, image: "Image", c: Outcome, u: Optional[Outcome], r: Optional[Outcome],
           drivers: list[dict], how: str) -> Resolution:
    """No resolution keeps the image's kept packages: the refusal, with the pin that works. A package the indexes
    this machine uses do not have is no ground for one (the instance may have an index of its own: its pip.conf),
    nor is a resolution without the constraints that could not be made."""
    cause = uv_cause(c.stderr)
    lacking = [n for n in missing_names(c.stderr) if n not in image.keep]
    if lacking:
        return Resolution(False, why=f"{', '.join(dict.fromkeys(lacking))} is not on the package indexes this machine "
                                     f"uses (uv says: {uv_cause(c.stderr, 200)}); the instance may have an index of "
                                     "its own: the plan judges without a resolution")
    ukind = classify(u) if u is not None else "no-solution"
    if ukind == "no-solution" and (u is None or not missing_names(u.stderr)) and \
            (u is not None or not image.keep):
        return Resolution(True, how=how, refusal=(
            f"the project's requirements cannot be installed together on {image.label} (python {image.python}, "
            f"{image.platform}): uv says: {uv_cause((u or c).stderr)}",
            f"fix the requirements uv names; `uv pip compile --python-version {image.python} --python-platform "
            f"{image.platform} requirements.txt` shows the same here"))
    if ukind != "ok":
        return Resolution(False, why=f"no resolution keeps the image's torch here (uv says: {uv_cause(c.stderr, 200)}),"
                                     f" and one without it could not be made to compare: the plan judges without a "
                                     "resolution")
    alone = resolved_of(u, image.arch)
    torch = image.packages.get("torch", "")
    kept = ", ".join(f"{n} {image.packages[n]}" for n in sorted(image.keep) if n in image.packages)
    msg = f"no resolution of the project's requirements keeps the image's {kept} ({image.label}): uv says: {cause}"
    replaced = [(n, image.packages[n], alone[n][0]) for n in sorted(image.keep)
                if n in image.packages and n in alone and not same(image.packages[n], alone[n][0])]
    if replaced:
        msg += "; " + pip_would(image, alone, replaced, drivers)
    return Resolution(True, how=how, replaces_image=replaced,
                      refusal=(msg, "; or ".join(pins_that_work(request, image, cause, alone, r))))


def pins_that_work(request: ResolveRequest, image: "Image", cause: str, alone: dict, r: Optional[Outcome]) -> list[str]:
    """The fixes: a kept package's own pin dropped (or asked for on purpose), the releases of the requirements uv
    named that work with the image's torch (the relaxed resolution), or that none does."""
    torch = image.packages.get("torch", "")
    want = alone.get("torch", ("",))[0]
    fixes = []
    for req in request.requirements:
        name = requirement_name(req) or ""
        if name in image.keep and relaxed(req).strip() != req.strip():
            asked = want or public(re.split(r"[=<>~!]+", req)[-1].strip())
            fixes.append(f"drop the pin `{req.strip()}` (the job then uses the image's {name} {image.packages[name]}),"
                         f" or install {name} {asked} on purpose: expect.packages: {{{name}: \"{asked}\"}} in the "
                         "profile (setup installs it for the driver's CUDA, and the plan resolves against it)")
    freed = [q for q in request.requirements if (requirement_name(q) or "") not in image.keep]
    named = [q for q in freed if mentioned(requirement_name(q) or "", cause)]
    if r is not None and classify(r) == "ok":
        got = resolved_of(r, image.arch)
        for req in named:
            name = requirement_name(req) or ""
            if name in got:
                fixes.append(f"pin {name}=={got[name][0]} (its newest release that works with the image's torch "
                             f"{torch})")
    elif named or not fixes:
        names = [requirement_name(q) for q in (named or freed)]
        fixes.append(f"no release of {', '.join(n for n in names if n) or 'these requirements'} works with the "
                     f"image's torch {torch}: ask for the torch they need on purpose (expect.packages: {{torch: "
                     f"\"{want or '<version>'}\"}} in the profile), on an instance whose driver runs it")
    return fixes


def from_export(out: Outcome, image: "Image", rows: list[dict]) -> Resolution:
    """What a uv.lock installs on the image (its torch too: the lock decides, `uv sync --locked` installs it)."""
    kind = classify(out)
    if kind != "ok":
        return Resolution(False, why=unavailable_why(kind, out) if kind != "other" else
                          f"uv export --frozen could not read uv.lock ({uv_cause(out.stderr, 240)}): the plan judges "
                          "without a resolution")
    locked = parse_export(out.stdout, image)
    packages = {n: v for n, v in locked.items() if not same(image.packages.get(n), v)}
    res = Resolution(True, packages=packages, resolved={**image.packages, **locked}, how="uv.lock (uv export --frozen)")
    res.replaces_image = [(n, image.packages[n], locked[n]) for n in sorted(image.keep)
                          if n in image.packages and n in locked and not same(image.packages[n], locked[n])]
    if res.replaces_image:
        what = ", ".join(f"{n} {new}" for n, _, new in res.replaces_image)
        over = ", ".join(f"{n} {old}" for n, old, _ in res.replaces_image)
        res.fixes.append(f"uv.lock pins {what}: setup's `uv sync --locked` installs it into the environment, over the "
                         f"image's {over} (the lock decides; `uv lock` with the image's torch keeps it)")
    res.builds = decide_builds({n: (v, None, "") for n, v in locked.items()}, image, rows, locked.get("torch"))
    return res

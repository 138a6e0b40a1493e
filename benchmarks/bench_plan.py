"""Figures for the local plan's resolution (issue 34): how long `gpuops.project.resolution` takes for an image, cold
(gpuops' uv cache empty: uv goes online for everything) and warm (the same cache: uv answers offline), with what it
resolved (packages, bytes to install, what it fixed or refused). Target: the local plan within 10 s on a large
repository with a warm cache. Not a pass/fail test.

Run: uv run python benchmarks/bench_plan.py [PROJECT_DIR ...]
  PROJECT_DIR: a project with a requirements.txt (its requirement lines are resolved as written, against PyPI or the
  indexes its lines name: this needs the network for the cold run). Without one: a generated large project (300
  packages, each requiring two others and some torch) against a local folder of metadata-only wheels, offline.
Env: BENCH_RUNS (warm runs, default 3), BENCH_IMAGE (default lambda-stack-22-04), BENCH_TIMEOUT (default 60 s).
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

RUNS = int(os.environ.get("BENCH_RUNS", "3"))
IMAGE = os.environ.get("BENCH_IMAGE", "lambda-stack-22-04")
TIMEOUT = float(os.environ.get("BENCH_TIMEOUT", "60"))


def requirement_lines(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(requirements, index lines) of a requirements file, as written (no includes followed)."""
    reqs, index = [], []
    for raw in path.read_text().replace("\\\n", " ").splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(("--index-url", "--extra-index-url", "--find-links", "-f ", "-i ")):
            index.append(line)
        elif not line.startswith("-"):
            reqs.append(line)
    return tuple(reqs), tuple(index)


def generated(folder: Path, n: int = 300) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A large project: n packages of 3 releases each, every one requiring two others and (one in ten) torch, the
    newest of those requiring a torch newer than the image's; plus torch 2.9.0/2.14.1 and torchvision."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.wheels import metadata_wheel

    wheels = folder / "wheels"
    wheels.mkdir(parents=True)
    metadata_wheel(wheels, "torch", "2.9.0", [], ["torch"])
    metadata_wheel(wheels, "torch", "2.14.1", [], ["torch"])
    metadata_wheel(wheels, "torchvision", "0.24.0", ["torch==2.9.0"], ["torchvision"])
    metadata_wheel(wheels, "torchvision", "0.29.2", ["torch==2.14.1"], ["torchvision"])
    for i in range(n):
        for minor in range(3):
            deps = [f"pkg{(i * 7 + k) % n}>=1.0" for k in (1, 2) if (i * 7 + k) % n != i]
            if i % 10 == 0:
                deps.append("torch>=2.11" if minor == 2 else "torch>=2.6")
            metadata_wheel(wheels, f"pkg{i}", f"1.{minor}.0", deps, [f"pkg{i}"])
    reqs = tuple(f"pkg{i}" for i in range(0, n, 3)) + ("torchvision",)
    return reqs, ("--no-index", f"--find-links {wheels}")


def bench(name: str, reqs: tuple[str, ...], index: tuple[str, ...], cache: Path) -> None:
    from gpuops.project import images
    from gpuops.project.resolution import human_bytes, resolve
    from gpuops.project.uvcmd import ResolveRequest

    os.environ["GPUOPS_UV_CACHE_DIR"] = str(cache)
    image = images.image_for(images.load(), IMAGE)
    request = ResolveRequest(reqs, index)
    t = time.perf_counter()
    cold = resolve(request, image, timeout_s=TIMEOUT)
    cold_s = time.perf_counter() - t
    warm = []
    for _ in range(RUNS):
        t = time.perf_counter()
        r = resolve(request, image, timeout_s=TIMEOUT)
        warm.append(time.perf_counter() - t)
    print(f"{name}: {len(reqs)} requirements -> {len(r.resolved)} resolved, setup installs {len(r.packages)} "
          f"({human_bytes(r.install_bytes)}) for {image.label}")
    print(f"  cold ({cold.how or cold.why[:80]}): {cold_s:.2f} s; warm ({r.how or r.why[:80]}): median "
          f"{statistics.median(warm):.2f} s, best {min(warm):.2f} s over {RUNS} runs (target <= 10 s)")
    builds = [f"builds: {b['name']} {b['version']}: {b['how']}" for b in r.builds]
    for line in (r.fixes + builds + ([f"REFUSED: {r.refusal[0]}"] if r.refusal else []))[:6]:
        print(f"  {line[:300]}")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        base = Path(tmp)
        if len(sys.argv) > 1:
            for i, arg in enumerate(sys.argv[1:]):
                reqs, index = requirement_lines(Path(arg) / "requirements.txt")
                bench(Path(arg).name, reqs, index, base / f"cache{i}")
        else:
            reqs, index = generated(base)
            bench("generated (300 packages, offline)", reqs, index, base / "cache")


if __name__ == "__main__":
    main()

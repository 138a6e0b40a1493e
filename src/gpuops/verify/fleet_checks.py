"""The fleet as a whole, judged over its hosts' verify reports (pure): the same stack on every host, every node
reaching rank 0's rendezvous port. Running the hosts is gpuops.hostpool's; judging one host is checks'."""
from __future__ import annotations

from typing import Optional

from .results import FAIL, PASS, WARN, CheckResult


def _values(reports: list[dict], pick) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {}
    for rank, rep in enumerate(reports):
        if rep is None:
            continue
        try:
            v = pick(rep["facts"])
        except (KeyError, TypeError, IndexError):
            v = None
        seen.setdefault("-" if v in (None, "") else str(v), []).append(rank)
    return seen


def _describe(seen: dict[str, list[int]]) -> str:
    return "; ".join(f"{v} on #{', #'.join(map(str, ranks))}" for v, ranks in seen.items())


def compare(reports: list[Optional[dict]]) -> list:
    """Fleet checks over the hosts' verify reports (None: host unreachable): the same GPU model and count, driver,
    CUDA, Python and package versions everywhere, differences named per host."""
    def gpus(f):
        names = sorted({g["name"] for g in f.get("gpus") or []})
        return ", ".join(names) or None

    aspects = [
        ("gpu_model", "GPU model", gpus, FAIL),
        ("gpu_count", "GPU count", lambda f: len(f.get("gpus") or []), FAIL),
        ("driver", "NVIDIA driver", lambda f: f.get("driver"), WARN),
        ("cuda", "CUDA (driver)", lambda f: f.get("cuda_driver"), WARN),
        ("python", "Python", lambda f: (f.get("python") or {}).get("version"), WARN),
    ]
    names = sorted({n for r in reports if r for n in ((r.get("facts") or {}).get("packages") or {})})
    for n in names:
        aspects.append((f"pkg.{n}", n, lambda f, n=n: (f.get("packages") or {}).get(n), FAIL))
    results = []
    for key, title, pick, bad in aspects:
        seen = _values(reports, pick)
        if len(seen) <= 1:
            if key.startswith("pkg.") and set(seen) == {"-"}:
                continue
            results.append(CheckResult(f"fleet.{key}", f"same {title} on every host", PASS,
                                       measured=next(iter(seen), "-")))
        else:
            results.append(CheckResult(f"fleet.{key}", f"same {title} on every host", bad, measured=_describe(seen),
                                       remediation="make every host match rank 0 (gpuops setup, or replace the odd "
                                                   "host): a mixed fleet fails or slows in collective operations"))
    return results


def reach_results(reports: list[Optional[dict]], master: str, port: int) -> list:
    """Does each node reach rank 0 on the rendezvous port? `refused` counts: the path works, nothing listens yet."""
    results = []
    for rank, rep in enumerate(reports):
        if rank == 0 or rep is None:
            continue
        fact = rep.get("reach") or {}
        val = fact.get("value") or {}
        res = val.get("result") if fact.get("ok") else (fact.get("error") or "not measured")
        ok = res in ("connected", "refused")
        results.append(CheckResult(
            f"fleet.reach.{rank}", f"#{rank} reaches rank 0 at {master}:{port}", PASS if ok else FAIL,
            measured=f"{res}" + (f" in {val['ms']:.0f} ms" if ok and "ms" in val else ""),
            remediation=None if ok else f"open TCP {port} between the nodes (firewall / security group) and use "
                                        f"addresses on the same private network (private_ip: in the profile)"))
    return results

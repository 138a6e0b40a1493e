"""verify/fleet_checks.py: the fleet as a whole, judged over its hosts' verify reports: the same stack on every host,
every node reaching rank 0's rendezvous port."""
from __future__ import annotations

from gpuops.verify import fleet_checks


def _report(gpu="NVIDIA H100 80GB HBM3", n=8, driver="570.148.08", torch="2.9.0+cu128", reach=None):
    rep = {"facts": {"gpus": [{"name": gpu}] * n, "driver": driver, "cuda_driver": "12.8",
                     "python": {"version": "3.10.12"}, "packages": {"torch": torch, "vllm": None}}}
    if reach is not None:
        rep["reach"] = reach
    return rep


def test_fleet_compare_names_the_differences_per_host():
    res = {r.id: r for r in fleet_checks.compare([_report(), _report(driver="550.54.15"), _report(torch="2.8.0+cu126")])}
    assert res["fleet.gpu_model"].status == "pass"
    assert res["fleet.driver"].status == "warn"
    assert res["fleet.driver"].measured == "570.148.08 on #0, #2; 550.54.15 on #1"
    assert res["fleet.pkg.torch"].status == "fail" and "2.8.0+cu126 on #2" in res["fleet.pkg.torch"].measured
    assert "fleet.pkg.vllm" not in res  # absent everywhere: nothing to compare


def test_fleet_compare_skips_unreachable_hosts():
    res = {r.id: r for r in fleet_checks.compare([_report(), None, _report()])}
    assert all(r.status == "pass" for r in res.values())


def test_reach_refused_counts_as_reachable_timeout_fails():
    ok = {"ok": True, "value": {"result": "refused", "ms": 0.2}}
    bad = {"ok": True, "value": {"result": "timeout", "ms": 5000}}
    res = fleet_checks.reach_results([_report(), _report(reach=ok), _report(reach=bad)], "10.0.0.1", 29500)
    assert [r.status for r in res] == ["pass", "fail"]
    assert "open TCP 29500" in res[1].remediation

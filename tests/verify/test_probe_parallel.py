"""The probe gathers at once (issue #23): the CUDA test and the bench import torch while nvidia-smi answers, and touch
the GPUs only once nvidia-smi has looked at them (the bench: once everything else is in).

The probe runs here as it runs on a host (`python -` with its PARAMS line), with the sandbox's emulated nvidia-smi
and emulated CUDA torch (sandbox/nvidia_smi.py, sandbox/image_torch.py), each wrapped to write what it does, in
order, to one log. Orderings are asserted, never durations: the probe's first GPU query waits until the torch
imports it is told of have begun, so a probe that starts them only after nvidia-smi gives up waiting (10 s) and says so.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpuops.remote.probe as probe
from gpuops.remote.gather import probe_source
from gpuops.sandbox import host

SRC = Path(host.__file__).parent

SMI = r'''#!{python}
import os, subprocess, sys, time
LOG = os.environ["PROBE_TEST_LOG"]


def who():
    """Which process asked nvidia-smi: the probe, the CUDA test or the bench (by the code on its command line)."""
    try:
        with open("/proc/%d/cmdline" % os.getppid(), "rb") as fh:
            cmd = fh.read()
    except OSError:
        return "?"
    return "bench" if b"timed_loop" in cmd else "cuda-test" if b'out = {"imported": False}' in cmd else "probe"


def note(text):
    with open(LOG, "a") as fh:
        fh.write(text + "\n")


args = sys.argv[1:]
q = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
kind = ("table" if not args else "devices" if q == "index,name,compute_cap,uuid" else "query" if q and
        q.startswith("index,name,uuid,") else "health" if q else "other")
me = who()
note("start %s %s" % (kind, me))
if kind == "query" and me == "probe":  # the probe's first look at the GPUs waits for the torch imports to begin
    wanted = [w for w in os.environ.get("PROBE_TEST_WAIT", "").split(",") if w]
    deadline = time.time() + 10
    while time.time() < deadline and not all("torch-imported " + w in open(LOG).read() for w in wanted):
        time.sleep(0.02)
    note("torch-seen" if all("torch-imported " + w in open(LOG).read() for w in wanted) else "torch-not-seen")
if os.environ.get("PROBE_TEST_EXEC"):  # a hung nvidia-smi: the probe's time limit must reach the process itself
    os.execv(sys.executable, [sys.executable, {smi!r}] + args)
code = subprocess.call([sys.executable, {smi!r}] + args)
note("end %s %s" % (kind, me))
sys.exit(code)
'''

TORCH_PREFIX = '''import atexit as _atexit, os as _os, __main__ as _m
_WHO = "bench" if hasattr(_m, "timed_loop") else "cuda-test"


def _note(what):
    with open(_os.environ["PROBE_TEST_LOG"], "a") as _fh:
        _fh.write("%s %s\\n" % (what, _WHO))


_note("torch-imported")
_atexit.register(_note, "torch-exit")
'''


def emulated_host(tmp: Path, wait: str) -> dict:
    """PATH, PYTHONPATH and the log for a local probe run on two emulated H100 SXM5."""
    (tmp / "bin").mkdir()
    smi = tmp / "bin" / "nvidia-smi"
    smi.write_text(SMI.replace("{python}", sys.executable).replace("{smi!r}", repr(str(SRC / "nvidia_smi.py"))))
    smi.chmod(0o755)
    (tmp / "site" / "torch").mkdir(parents=True)
    (tmp / "site" / "torch" / "__init__.py").write_text(TORCH_PREFIX + (SRC / "image_torch.py").read_text())
    (tmp / "gpu").mkdir()
    host.write_gpu_state(tmp / "gpu", gpu="h100-sxm5", gpus=2, driver="580.159.04", cuda="13.0", fail="none",
                         header="legacy")
    log = tmp / "events.log"
    log.write_text("")
    return {**os.environ, "PATH": f"{tmp / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(tmp / "site"),
            "GPUOPS_SANDBOX_DIR": str(tmp / "gpu"), "PROBE_TEST_LOG": str(log), "PROBE_TEST_WAIT": wait}


def run_probe(env: dict, **params) -> tuple[dict, list[str]]:
    p = subprocess.run([sys.executable, "-"], input=probe_source({"health": True, "timeouts": {"nvidia_smi": 15},
                                                                  **params}),
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), Path(env["PROBE_TEST_LOG"]).read_text().splitlines()


def test_torch_imports_while_nvidia_smi_answers_and_cuda_starts_after_it_looked(tmp_path):
    check = {"name": "gpus listed", "command": "nvidia-smi -L", "timeout": 30}
    doc, events = run_probe(emulated_host(tmp_path, "cuda-test"), cuda_check=True, user_checks=[check])
    assert "torch-seen" in events, events  # the CUDA test's import had begun before the first GPU query ended
    res = doc["cuda"]["value"]["result"]
    assert res["available"] is True and res["device_count"] == 2 and "waited_seconds" in res, res
    looked = [i for i, e in enumerate(events) if e in ("end query probe", "end table probe", "end health probe")]
    assert len(looked) == 3, events
    cuda_init = events.index("start devices cuda-test")  # the emulated torch finds its GPUs through nvidia-smi
    assert cuda_init > max(looked), events  # so nvidia-smi never saw the CUDA test's process or memory
    assert doc["gpu_health"]["ok"] and doc["nvidia_smi"]["value"]["rc"] == 0
    # the playbook's own checks run once the CUDA test is over: one that looks at the GPUs sees them without it
    assert events.index("start other probe") > events.index("torch-exit cuda-test"), events
    assert doc["user_checks"]["value"]["gpus listed"]["value"]["rc"] == 0


def test_the_bench_imports_at_once_and_loads_the_gpus_after_everything_else(tmp_path):
    bench = {"device": "cuda", "seconds": 0.1, "allreduce": False}
    doc, events = run_probe(emulated_host(tmp_path, "cuda-test,bench"), cuda_check=True, bench=bench)
    assert "torch-seen" in events, events  # both imports had begun before the first GPU query ended
    bench_init = events.index("start devices bench")
    assert bench_init > events.index("end devices cuda-test"), events  # after the CUDA test
    assert bench_init > max(i for i, e in enumerate(events) if e.endswith(" probe")), events
    assert "waited_seconds" in doc["bench"]["value"]["result"], doc["bench"]


def test_a_gate_closed_without_go_leaves_the_gpus_untouched(tmp_path):
    """The probe ending first (an error) closes the gate without the byte: the check ends without a CUDA call."""
    env = emulated_host(tmp_path, "")
    gate = probe.Gate()
    started = probe.start_gated([sys.executable, "-c", probe.CUDA_CHECK], gate, env=env)
    gate.open(go=False)
    gate.open()  # too late, and harmless
    res = probe.last_json(probe.finish(started, 60), 60)
    assert res["result"]["error"] == "not run: the probe ended first" and res["result"]["imported"] is True, res
    assert not [e for e in Path(env["PROBE_TEST_LOG"]).read_text().splitlines() if e.startswith("start")]


def test_a_hung_nvidia_smi_still_costs_its_budget_once_and_the_rest_is_gathered(tmp_path):
    """The first GPU query alone: on a hung driver no other nvidia-smi call is started, and the host facts and the
    CUDA test (which has no GPU to wait for here: torch is absent) are still reported."""
    env = emulated_host(tmp_path, "")
    host.write_gpu_state(tmp_path / "gpu", gpu="h100-sxm5", gpus=1, driver="580.159.04", cuda="13.0", fail="hang",
                         header="legacy")
    env.update(PYTHONPATH=str(tmp_path / "no-torch"), PROBE_TEST_EXEC="1")
    doc, events = run_probe(env, cuda_check=True, timeouts={"nvidia_smi": 1})
    assert doc["nvidia_smi_query"]["value"]["timeout"] is True and doc["nvidia_smi"] == doc["nvidia_smi_query"]
    assert [e for e in events if e.startswith("start")] == ["start query probe"], events
    assert "gpu_health" not in doc and doc["os"]["ok"] and doc["packages"]["ok"]
    assert doc["cuda"]["value"]["result"]["imported"] is False


def test_on_a_hung_driver_the_cuda_test_and_the_bench_do_not_touch_a_gpu_and_say_why(tmp_path):
    """A hung nvidia-smi means a driver that does not answer; CUDA's initialisation then hangs too (the emulated
    torch does, as the real one does). The CUDA test and the bench used to be let through anyway and waited out
    their whole limits (90 s and 180 s). Now their gate tells them the driver hung: they end after their import, and
    verify says why the CUDA test did not run."""
    from gpuops import knowledge
    from gpuops.profiles.model import Profile
    from gpuops.verify.checks import FAIL, evaluate
    from gpuops.verify.facts import from_probe

    env = emulated_host(tmp_path, "")
    host.write_gpu_state(tmp_path / "gpu", gpu="h100-sxm5", gpus=1, driver="580.159.04", cuda="13.0", fail="hang",
                         header="legacy")
    env.update(PROBE_TEST_EXEC="1")
    bench = {"device": "cuda", "seconds": 0.1, "allreduce": False}
    doc, events = run_probe(env, cuda_check=True, bench=bench, timeouts={"nvidia_smi": 1})
    assert [e for e in events if e.startswith("start")] == ["start query probe"], events  # no CUDA call at all
    assert "torch-imported cuda-test" in events and "torch-imported bench" in events, events
    cuda = doc["cuda"]["value"]["result"]
    assert cuda["imported"] is True and cuda["driver_hung"] is True and "nvidia-smi hung" in cuda["error"], cuda
    assert doc["bench"]["value"]["result"]["driver_hung"] is True, doc["bench"]
    kn = knowledge.knowledge()
    profile = Profile.model_validate({"name": "h", "host": "h", "expect": {"gpu": "H100 SXM5", "gpu_count": 1}})
    results = {r.id: r for r in evaluate(from_probe(doc, failures=kn["nvidia_smi_failures"]), profile,
                                         knowledge.load_playbook("verify"), kn, knowledge.presets(), {})}
    rt = results["cuda.runtime"]
    assert rt.status == FAIL and rt.measured == "not run: the driver does not answer" and "reboot" in rt.remediation
    assert results["gpu.nvidia_smi"].status == FAIL

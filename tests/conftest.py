"""Test fixtures: an isolated environment per test and ONE real sandbox host (sshd on 127.0.0.1) per session.

The sandbox is required: if sshd or rsync is missing, tests that need it FAIL (never skip).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import distenv  # noqa: E402 - reads the real HOME now, before tests isolate it
from support import wheels  # noqa: E402 - the same (its cache folder)
from support.cloud import API_KEY
from support.runs import kill_run_groups, remote_project


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    @property
    def all(self) -> str:
        return self.out + self.err


@pytest.fixture(scope="session")
def sshd():
    """OpenSSH's server, which every sandbox host and emulated instance runs: required, so its absence FAILS the
    tests that need it (never a skip). A test using it, directly or through another fixture, is marked e2e."""
    from gpuops.sandbox import host

    try:
        return host.find_sshd()
    except Exception:
        pytest.fail("sshd is not installed: the sandbox tests need openssh-server (.ci/run installs it)")


@pytest.fixture(scope="session")
def sandbox_base(sshd, tmp_path_factory):
    """Start the sandbox host once per session (under xdist: once per worker, each its own host): its state lives
    in a session temp dir, never in the user's home."""
    from gpuops.sandbox import host

    base = tmp_path_factory.mktemp("gpuops-session")
    old = {k: os.environ.get(k) for k in ("GPUOPS_STATE_DIR", "GPUOPS_CONFIG_DIR")}
    os.environ["GPUOPS_STATE_DIR"] = str(base / "state")
    os.environ["GPUOPS_CONFIG_DIR"] = str(base / "config")
    st = host.up()
    yield {"base": base, "state_dir": base / "state", "dir": Path(st["dir"]), "port": st["port"], "user": st["user"]}
    host.down()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture
def starts_hosts(sshd, tmp_path):
    """For a test that starts its own sandbox hosts or emulator (in-process or through `gpuops sandbox up` in a
    child) under its tmp_path: whatever sshd still runs there at the end is stopped."""
    yield tmp_path
    from gpuops.sandbox import host

    for pid_file in tmp_path.rglob("sshd.pid"):
        if (pid_file.parent / "sshd_config").is_file():
            host.stop(pid_file.parent)


@pytest.fixture(scope="session")
def slurm_cluster(sshd, tmp_path_factory):
    """A local Slurm cluster (gpuops.sandbox.slurm: Debian's slurmctld, slurmd and munge) of 4 nodes n1..n4, 8 emulated
    GPUs each, partition `gpu`, and its login node (a sandbox host): one per session (under xdist: per worker, with
    its own ports, munge socket and ClusterName), started when a test first asks for it, stopped at the end. The
    daemons are required: their absence FAILS the tests that need them (never a skip). A support.slurm.SlurmCluster."""
    from gpuops.sandbox import slurm, slurm_procs
    from support.slurm import start

    try:
        for tool in ("munged", "slurmctld", "slurmd", "sbatch"):
            slurm_procs.find_tool(tool)
    except Exception:
        pytest.fail("Slurm is not installed: the Slurm tests need slurmctld, slurmd, slurm-client and munge "
                    "(scripts/install-system-deps.sh installs them)")
    d = tmp_path_factory.mktemp("slurm")
    cluster = start(d, 4)
    yield cluster
    slurm.stop(d)


@pytest.fixture(scope="session")
def slurm_accounting_cluster(sshd, tmp_path_factory):
    """Another local Slurm cluster, of 2 nodes, with accounting (slurmdbd and a private MariaDB: `sacct` answers),
    for the tests that need sacct; started when first asked for (about 8 s, 110 MB), stopped at the end."""
    from gpuops.sandbox import slurm, slurm_accounting, slurm_procs
    from support.slurm import start

    try:
        for tool in ("munged", "slurmctld", "slurmd", "sbatch"):
            slurm_procs.find_tool(tool)
        slurm_accounting.find_tools()
    except Exception:
        pytest.fail("slurmdbd or mariadb-server is not installed: the Slurm accounting tests need them "
                    "(scripts/install-system-deps.sh installs them)")
    d = tmp_path_factory.mktemp("slurmacct")
    cluster = start(d, 2, accounting=True)
    yield cluster
    slurm.stop(d)


@pytest.fixture
def slurm_idle(slurm_cluster):
    """The worker's Slurm cluster as a test finds it fresh: no job, every node's slurmd running, its GPUs healthy and
    the node idle (what an earlier test drained, lost or faulted is brought back first)."""
    slurm_cluster.reset()
    return slurm_cluster


@pytest.fixture
def short_tmp():
    """A folder with a short path (/tmp/gx-XXXX), removed after the test: for Unix sockets (ssh's ControlPath, an
    agent's socket), whose paths must stay within 104 bytes; under xdist, tmp_path (.../popen-gwN/<test>N/) may not."""
    import tempfile

    d = Path(tempfile.mkdtemp(prefix="gx-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def dist_python():
    """A Python with CPU torch and Ray (tests/support/distenv.py: built once per machine, cached)."""
    return str(distenv.python())


@pytest.fixture(scope="session")
def wheel_index():
    """A folder of metadata-only wheels (tests/support/wheels.py) that uv resolves offline: `--no-index
    --find-links <it>`. Built once per machine and kept."""
    return wheels.index()


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Each test: its own HOME, config dir (profiles, known_hosts) and project directory; plain output."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GPUOPS_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.setenv("WANDB_MODE", "offline")
    # the local plan resolves with uv (project/uvrun.py): in the tests only against the folders a test names
    # (--find-links lines, tests/support/wheels.py), never an index on the internet
    monkeypatch.setenv("UV_NO_INDEX", "1")
    monkeypatch.setenv("GPUOPS_UV_CACHE_DIR", str(wheels.CACHE / "uv-plan"))
    for var in ("GPUOPS_PROFILE", "GPUOPS_DEBUG", "WANDB_API_KEY", "GPUOPS_FORCE_RICH"):
        monkeypatch.delenv(var, raising=False)
    project = tmp_path / tmp_path.name  # unique name: the sandbox's remote dir defaults to ~/<this name>
    project.mkdir()
    monkeypatch.chdir(project)
    return project


@pytest.fixture
def sandbox(sandbox_base, monkeypatch, tmp_path):
    """The running sandbox host, with a fresh `sandbox` profile in this test's config dir (GPU state reset)."""
    from gpuops.sandbox import host

    monkeypatch.setenv("GPUOPS_STATE_DIR", str(sandbox_base["state_dir"]))
    st = host.up()  # already running: rewrites gpu.json to defaults and writes this test's profile
    assert st["port"] == sandbox_base["port"]
    _end_earlier_tests_runs(Path(sandbox_base["dir"]) / "home")
    return {**sandbox_base, "profile": host.profile_path()}


def _end_earlier_tests_runs(home: Path) -> None:
    """The worker's tests share one sandbox host, and a launch refuses while another gpuops run lives on the host
    ("another gpuops run is still running on the host: job-..."): a run an earlier test left alive (in any project)
    is ended and unlisted before this test starts (tests of one worker run one after another)."""
    active = home / ".gpuops" / "active"
    for f in active.iterdir() if active.is_dir() else []:
        try:
            kill_run_groups([Path(f.read_text().strip())])
        except OSError:
            pass
        f.unlink(missing_ok=True)


@pytest.fixture
def gpuops(capsys):
    """Run the CLI in-process: gpuops("verify", "sandbox") -> CliResult(code, out, err)."""
    from gpuops.cli import main

    def call(*args: str) -> CliResult:
        main.DEBUG = False
        capsys.readouterr()
        code = main.run(list(args))
        cap = capsys.readouterr()
        return CliResult(code, cap.out, cap.err)

    return call


@pytest.fixture
def cleanup_runs(sandbox):
    """Kill whatever a test left running in its remote project (the sandbox host is shared by the worker's tests)."""
    yield
    runs = remote_project(sandbox) / ".gpuops" / "runs"
    kill_run_groups(runs.iterdir() if runs.is_dir() else [])


@pytest.fixture(scope="session")
def cloud_emu(sshd, tmp_path_factory):
    """The Lambda API emulator, one per session (per xdist worker): a real HTTP server whose instances are sandbox
    hosts on free 127.0.0.N:22 addresses."""
    from gpuops.cloud.emulator.server import Emulator

    emu = Emulator(tmp_path_factory.mktemp("lambda-emu"), api_key=API_KEY, boot_seconds=0.5, terminate_seconds=0.2,
                   launch_window=0).start()
    yield emu
    emu.close()


@pytest.fixture
def cloud(cloud_emu, monkeypatch, tmp_path, isolated):
    """The emulator, this test's API key and fast timing knobs, and an SSH key for `up --key`."""
    monkeypatch.setenv("LAMBDA_API_KEY", API_KEY)
    monkeypatch.setenv("GPUOPS_LAMBDA_API_URL", cloud_emu.url)
    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("GPUOPS_CLOUD_POLL_S", "0.2")
    monkeypatch.setenv("GPUOPS_CLOUD_LAUNCH_INTERVAL_S", "0")
    monkeypatch.setenv("GPUOPS_CLOUD_BACKOFF_S", "0.05")
    monkeypatch.setenv("GPUOPS_CLOUD_CAPACITY_RECHECK_S", "0.5")
    for k, v in cloud_emu.env.items():
        monkeypatch.setenv(k, v)
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e", "-f", str(key)], check=True)
    cloud_emu.reset()
    cloud_emu.key = key
    yield cloud_emu
    cloud_emu.reset()


@pytest.fixture
def browser():
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=20000)

    from support.browser import ARGS, CHROMIUM

    assert os.path.exists(CHROMIUM), "chromium is not installed: scripts/install-system-deps.sh installs it"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


# -- tiers ---------------------------------------------------------------------------------------------------------
# A test is e2e when it uses, directly or through another fixture, one of these: sshd (every sandbox host and
# emulated instance: `sandbox`, `cloud`, `starts_hosts` and the like depend on it), the CPU torch venv, a browser or
# the local Slurm cluster (`slurm_cluster`, `slurm_idle`, `slurm_accounting_cluster`).
# Marked here from the fixtures, never by hand, so the mark cannot drift; the fast tier is `pytest -m "not e2e"`.
# And a test left unmarked cannot start a sandbox host in-process: `_unmarked_start_no_host` fails it.
E2E_FIXTURES = frozenset({"sshd", "dist_python", "browser", "slurm_cluster", "slurm_accounting_cluster"})


# The longest first, so the long end-to-end runs start early and the suite ends on short tests instead of one worker
# finishing a 30 s test alone (the folders' order is what --durations shows: whole `gpuops run`s through the
# emulator, docs blocks, browsers, fleets...). The README's `--dist worksteal` starts each worker on a contiguous
# slice of this order and lets an idle worker take the back half of the longest queue: the order is dealt out so
# that every slice starts with its share of the long tests (a worker never queues five 30 s runs while another idles).
SLOW_FIRST = ("pipeline", "slurm", "docs", "dashboard", "fleet", "cloud", "jobs", "setup", "transfer", "verify", "sandbox")


def _weight(item) -> tuple:
    e2e = item.get_closest_marker("e2e") is not None
    top = item.path.parent.name if item.path.parent.name != "tests" else ""
    return (0 if e2e else 1, SLOW_FIRST.index(top) if top in SLOW_FIRST else len(SLOW_FIRST))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if E2E_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    items.sort(key=_weight)  # stable: a file's tests keep their order
    n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    if n > 1:  # xdist's worksteal starts each worker on a contiguous slice: each slice gets its share of the long ones
        items[:] = [x for k in range(n) for x in items[k::n]]


@pytest.fixture(autouse=True)
def _unmarked_start_no_host(request, monkeypatch):
    """A test not marked e2e that starts an sshd in-process fails, naming the fixture it should use: the fast tier
    stays fast and the e2e mark follows what tests do."""
    if request.node.get_closest_marker("e2e"):
        return

    def refuse(*args, **kwargs):
        pytest.fail("this test starts a sandbox host without a fixture that marks it e2e: use `sandbox`, `cloud` or "
                    "`starts_hosts` (tests/conftest.py)")

    monkeypatch.setattr("gpuops.sandbox.host._start_sshd", refuse)

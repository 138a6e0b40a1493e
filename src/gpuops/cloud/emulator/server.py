"""A local Lambda Cloud API (OpenAPI 1.8.3) on 127.0.0.1: real HTTP, the documented paths, fields, status codes and
error codes, Bearer auth, and instances that are real sandbox hosts (sshd on their own 127.0.0.N:22).

In-process:   emu = Emulator(state_dir, api_key="..."); emu.start(); emu.url -> "http://127.0.0.1:PORT/api/v1"
              knobs: capacity(), set_capacity(), capacity_later(), fault(), clear_faults(), boot_seconds(),
              terminate_seconds(), launch_window(), advance(), clock_rate(), preempt(), set_status(),
              drop_connections(), gpu_fault(), oom_kill(), unreachable(), mount_root(), fs_dir(), instances(), launch_requests(),
              reset(), close()
Other processes: the same knobs under POST /_emulator/<knob> with a JSON object of keyword arguments, GET
              /_emulator/state (Bearer key required, like the API). `gpuops sandbox up --cloud` runs it as a daemon.

Filesystems: each is one folder (<state_dir>/filesystems/<id>) that every instance attaching it sees at its mount
point, a symlink under the mount root (mount_root(); the API reports the rooted path, so the path the API reports is
the path the job sees). State (instances, keys, capacity and capacity to come, faults, clock) is saved to <state_dir>/state.json after every change and read back
on start, so a restarted daemon knows its instances. Instance hosts live in <state_dir>/hosts/<instance id>/.

This module is the account's state (instances, keys, capacity, filesystems, faults, the clock) and its knobs; the API's
paths are routes.py (a mixin), the instances' hosts hosts.py (a mixin), the HTTP layer httpd.py, the errors and faults
Lambda answers with faults.py, the types, regions and images catalog.py.
"""
from __future__ import annotations

import getpass
import json
import os
import secrets
import shutil
import signal
import threading
import time
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path

from ...paths import write_private
from .faults import ERRORS, FAULTS, NGINX_TITLES, ONCE_BY_DEFAULT
from .hosts import InstanceHosts
from .httpd import _handler, _Server
from .routes import Routes
from . import catalog


LAUNCH_WINDOW_S = 12.0  # Lambda: one launch request per 12 s


def new_api_key() -> str:
    return f"secret_gpuops-emulator_{secrets.token_hex(16)}.{secrets.token_hex(16)}"


class Emulator(Routes, InstanceHosts):
    def __init__(self, state_dir: Path, *, api_key: str | None = None, port: int = 0, boot_seconds: float = 2.0,
                 terminate_seconds: float = 1.0, launch_window: float = LAUNCH_WINDOW_S, python: str | None = None):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.api_key = api_key or new_api_key()
        self.user = getpass.getuser()  # instances log in as this user (Lambda's images: ubuntu)
        self.python = python
        self.lock = threading.RLock()
        self._port = port
        self.server: ThreadingHTTPServer | None = None
        self._defaults = {"boot_seconds": boot_seconds, "terminate_seconds": terminate_seconds,
                          "launch_window": launch_window}
        self._fresh()
        self._load()
        self._clock.update(self._defaults)  # the clock options this emulator was started with win over saved ones

    # -- lifecycle -----------------------------------------------------------------------------------------------
    def start(self) -> "Emulator":
        handler = _handler(self)
        self.server = _Server(("127.0.0.1", self._port), handler)
        threading.Thread(target=self.server.serve_forever, name="lambda-emulator", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self.server, "start() first"
        return f"http://127.0.0.1:{self.server.server_address[1]}/api/v1"

    @property
    def env(self) -> dict:
        """Environment for a gpuops process using this emulator."""
        return {"LAMBDA_API_KEY": self.api_key, "GPUOPS_LAMBDA_API_URL": self.url, "GPUOPS_CLOUD_SSH_USER": self.user}

    def close(self) -> None:
        """Stop every instance host (their instances end `terminated`: nothing keeps running), then the server."""
        with self.lock:
            for inst in self._instances.values():
                self._stop_host(inst)
                if inst["status"] not in ("terminated", "preempted"):
                    inst["status"], inst["_ended"] = "terminated", self.now()
            self._save()
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def _fresh(self) -> None:
        self._instances: dict = {}
        self._keys: list = []
        self._filesystems: list = []
        self._firewall_rules: list = [{"protocol": "tcp", "port_range": [22, 22], "source_network": "0.0.0.0/0",
                                       "description": "Allow SSH from anywhere"}]
        self._capacity: dict = {t: {r: catalog.DEFAULT_SLOTS for r in catalog.DEFAULT_REGIONS}
                                for t in catalog.available_types()}
        self._failing: list = []  # [type, region]: listed as available, the launch fails
        self._arrivals: list = []  # [emulated time, type, region, slots]: capacity that frees up then (capacity_later)
        self._faults: dict = {}
        self._clock = dict(self._defaults, offset=0.0, rate=1.0, anchor_real=0.0, anchor_emu=0.0)
        self._last_launch = -1e18
        self._launches = 0
        self._requests = 0
        self._image: dict = {"python": None, "files": {}}  # what new instances boot with (the `image` knob)
        self._mount_root: str = str(self.dir / "root")  # the instances' "/" for mount points (the `mount_root` knob)

    def _load(self) -> None:
        try:
            doc = json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return
        for k in ("instances", "keys", "filesystems", "firewall_rules", "capacity", "failing", "arrivals", "faults",
                  "clock", "last_launch", "launches", "image", "mount_root"):
            if k in doc:
                setattr(self, "_" + k, doc[k])

    def _save(self) -> None:
        doc = {k: getattr(self, "_" + k) for k in ("instances", "keys", "filesystems", "firewall_rules", "capacity",
                                                   "failing", "arrivals", "faults", "clock", "last_launch", "launches",
                                                   "image", "mount_root")}
        write_private(self.dir / "state.json", json.dumps(doc, indent=1))

    def now(self) -> float:
        """The emulator's clock: real time, moved on by advance() and run faster by clock_rate()."""
        c = self._clock
        rate = c.get("rate", 1.0)
        if rate == 1.0 and not c.get("anchor_real"):
            return time.time() + c["offset"]
        return c.get("anchor_emu", 0.0) + (time.time() - c.get("anchor_real", 0.0)) * rate + c["offset"]

    # -- knobs (also POST /_emulator/<name>) ---------------------------------------------------------------------
    def reset(self) -> None:
        """Terminate every instance (hosts stopped), forget keys and filesystems (their folders removed), restore default
        capacity, clock and no faults."""
        with self.lock:
            for inst in self._instances.values():
                self._stop_host(inst)
            shutil.rmtree(self.dir / "filesystems", ignore_errors=True)
            shutil.rmtree(self.dir / "root", ignore_errors=True)  # the default root's links (another root is left)
            self._fresh()
            self._save()

    def capacity(self, type_name: str, regions: list, failing: list = (), slots: int = catalog.DEFAULT_SLOTS) -> None:
        """`type_name` has `slots` free instances in each of `regions` and none elsewhere; `failing` regions are listed
        as available but their launches answer insufficient-capacity."""
        with self.lock:
            self._capacity[type_name] = {r: slots for r in regions}
            self._failing = [f for f in self._failing if f[0] != type_name] + [[type_name, r] for r in failing]
            self._save()

    def capacity_later(self, type_name: str, regions: list, after: float, slots: int = catalog.DEFAULT_SLOTS) -> None:
        """`type_name` gets `slots` free instances in each of `regions` once `after` seconds of the emulator's clock
        have passed (capacity freed by other customers; with clock_rate() the wait passes faster)."""
        with self.lock:
            at = self.now() + float(after)
            self._arrivals += [[at, type_name, r, int(slots)] for r in regions]
            self._save()

    def _arrive(self) -> None:
        """Capacity whose time has come (capacity_later) becomes free."""
        now = self.now()
        due = [a for a in self._arrivals if a[0] <= now]
        if not due:
            return
        self._arrivals = [a for a in self._arrivals if a[0] > now]
        for _, t, r, slots in due:
            self._capacity.setdefault(t, {})[r] = slots

    def set_capacity(self, type_name: str, region: str, slots: int, failing: bool = False) -> None:
        with self.lock:
            self._capacity.setdefault(type_name, {})[region] = slots
            self._failing = [f for f in self._failing if f != [type_name, region]]
            if failing:
                self._failing.append([type_name, region])
            self._save()

    def fault(self, name: str, times: int | None = -1, **params) -> None:
        """Inject a fault (see FAULTS). times: how often it fires (default: once for 5xx and the launch faults,
        else until clear_faults)."""
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")
        if params.get("error") is not None and params["error"] not in ERRORS:
            raise ValueError(f"unknown error {params['error']!r}; known: {', '.join(ERRORS)}")
        with self.lock:
            self._faults[name] = {"times": (1 if name in ONCE_BY_DEFAULT else None) if times == -1 else times,
                                  **params}
            self._save()

    def clear_faults(self) -> None:
        with self.lock:
            self._faults = {}
            self._save()

    def image(self, python: str | None = None, files: dict | None = None) -> None:
        """What instances launched from now on boot with: `python`, an image of sandbox/image.py IMAGES (e.g.
        "lambda-stack": the system python3 has a CUDA build of torch and pip) or None (the test machine's python3);
        `files`, {path under the home: text} placed on the instance's disk (a host's own ~/.config/pip/pip.conf)."""
        from ...sandbox.image import IMAGES

        if python is not None and python not in IMAGES:
            raise ValueError(f"unknown image python {python!r}; known: {', '.join(IMAGES)}")
        with self.lock:
            self._image = {"python": python, "files": dict(files or {})}
            self._save()

    def mount_root(self, path: str) -> None:
        """Where the instances' mount points live on this machine: a filesystem mounted at /lambda/nfs/NAME is the
        folder PATH/lambda/nfs/NAME, and the API reports that path (the emulated instances share this machine's
        disk, so the path the API reports is the path the job sees). Default <state_dir>/root; "/" (a daemon run as
        root) reports Lambda's own paths. Applies to filesystems created and mounts made from now on."""
        with self.lock:
            self._mount_root = str(Path(path).resolve()) if path != "/" else "/"
            self._save()

    def fs_dir(self, name: str) -> Path:
        """The folder holding filesystem NAME's data (what every instance attaching it sees at its mount point)."""
        with self.lock:
            fs = next((f for f in self._filesystems if f["name"] == name), None)
            if fs is None:
                raise KeyError(name)
            return Path(fs["_dir"])

    def boot_seconds(self, s: float) -> None:
        self._set_clock(boot_seconds=s)

    def terminate_seconds(self, s: float) -> None:
        self._set_clock(terminate_seconds=s)

    def launch_window(self, s: float) -> None:
        self._set_clock(launch_window=s)

    def advance(self, s: float) -> None:
        """Move the emulator's clock forward (boots and terminations complete sooner)."""
        with self.lock:
            self._clock["offset"] += s
            self._save()

    def clock_rate(self, rate: float) -> None:
        """From now on the emulator's clock runs `rate` times as fast as real time (boots, terminations and
        capacity_later arrivals come sooner); 1 is real time."""
        if not rate > 0:
            raise ValueError("rate must be above 0")
        with self.lock:
            now = self.now()
            self._clock.update(rate=float(rate), anchor_real=time.time(), anchor_emu=now - self._clock["offset"])
            self._save()

    def _set_clock(self, **kw) -> None:
        with self.lock:
            self._clock.update(kw)
            self._save()

    def preempt(self, instance_id: str) -> None:
        self.set_status(instance_id, "preempted")

    def set_status(self, instance_id: str, status: str) -> None:
        with self.lock:
            inst = self._instances[instance_id]
            inst["status"] = status
            if status in ("preempted", "terminated", "terminating"):
                inst["_ended"] = self.now()
                self._stop_host(inst)
            self._save()

    def gpu_fault(self, instance_id: str, fault: str, kill_jobs: bool = False) -> list:
        """A running instance's GPU fails from now on, as `gpuops sandbox up --fault FAULT` describes it (`xid=79`: the
        driver's "GPU has fallen off the bus" line in its kernel log; `ecc`: uncorrectable ECC errors; ...): its
        nvidia-smi and kernel log say so, the API keeps saying `active`. Its job keeps running, or with kill_jobs
        dies at that moment (SIGKILL, as a CUDA job does when its GPU falls off the bus). Returns its faults."""
        from ...paths import write_atomic
        from ...sandbox.host import gpu_job_processes, kill_gpu_jobs
        from ...sandbox.nvidia_smi import fault_problem

        with self.lock:
            f = Path(self._get(instance_id)["_dir"]) / "gpu.json"
            state = json.loads(f.read_text())
            why = fault_problem(fault, int(state.get("count") or 1))
            if why:
                raise ValueError(why)
            # the job's processes found first, so that the fault and their deaths are microseconds apart; the fault
            # is in the host's data before the job dies: whoever looks after sees it
            victims = gpu_job_processes(f.parent) if kill_jobs else []
            state["faults"] = list(state.get("faults") or []) + [fault]
            write_atomic(f, json.dumps(state, indent=1))
            if kill_jobs:
                kill_gpu_jobs(f.parent, victims)
            return state["faults"]

    def oom_kill(self, instance_id: str) -> "int | None":
        """The instance's kernel runs out of RAM: its OOM killer kills the job's biggest process (SIGKILL) and says so
        in the kernel log, as Linux does (sandbox.host.oom_kill). Returns the pid killed (None: no job runs)."""
        from ...sandbox.host import oom_kill

        with self.lock:
            d = Path(self._get(instance_id)["_dir"])
        return oom_kill(d)

    def unreachable(self, instance_id: str) -> int:
        """The instance stops answering on the network for good: its sshd and every SSH connection to it end (new
        ones are refused), its jobs keep running, the API keeps saying `active`. Returns the connections cut."""
        from ...sandbox import host

        with self.lock:
            listener = host.sshd_pid(Path(self._get(instance_id)["_dir"]))
        cut = self.drop_connections(instance_id)
        if listener:
            try:
                os.kill(listener, signal.SIGKILL)
            except OSError:
                pass
        return cut

    def drop_connections(self, instance_id: str) -> int:
        """The instance's network drops for a moment: every SSH connection to it is cut (its sshd's per-connection
        processes end); sshd keeps listening, the jobs keep running and the API keeps saying `active`. Returns how
        many connections were cut."""
        from ...sandbox import host

        with self.lock:
            inst = self._get(instance_id)
            listener = host.sshd_pid(Path(inst["_dir"])) if inst.get("_dir") else None
        cut = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if listener and ppid == listener:
                try:
                    os.kill(int(stat.parent.name), signal.SIGKILL)
                    cut += 1
                except OSError:
                    pass
        return cut

    def instances(self) -> list:
        """Every instance as GET /instances shows it (terminated ones too), plus `_dir` and `_address` (its sandbox host)."""
        with self.lock:
            return [dict(self._view(i), _dir=i.get("_dir"), _address=i.get("_address"))
                    for i in self._instances.values()]

    def home(self, instance_id: str) -> Path:
        """The instance's remote $HOME on this machine (what a test plants or inspects on the 'instance' disk)."""
        with self.lock:
            return Path(self._get(instance_id)["_dir"]) / "home"

    def launch_requests(self) -> int:
        return self._launches

    def state(self) -> dict:
        with self.lock:
            return {"url": self.url if self.server else None, "user": self.user, "clock": self._clock,
                    "capacity": self._capacity, "failing": self._failing, "arrivals": self._arrivals,
                    "faults": self._faults, "image": self._image.get("python"),
                    "launch_requests": self._launches, "instances": self.instances()}

    KNOBS = ("reset", "capacity", "set_capacity", "capacity_later", "fault", "clear_faults", "boot_seconds",
             "terminate_seconds", "launch_window", "advance", "clock_rate", "preempt", "set_status", "image",
             "drop_connections", "gpu_fault", "oom_kill", "unreachable", "mount_root")

    # -- faults --------------------------------------------------------------------------------------------------
    def _take_fault(self, name: str, path: str = "") -> dict | None:
        f = self._faults.get(name)
        if f is None or (f.get("path") and f["path"] not in path):
            return None
        if f.get("times") is not None:
            f["times"] -= 1
            if f["times"] <= 0:
                del self._faults[name]
        return f

    def proxy_page(self, path: str) -> tuple[int, str] | None:
        """The `proxy-page` fault: (status, nginx's HTML error page) for this API path, or None."""
        if not path.startswith("/api/v1/"):
            return None
        with self.lock:
            f = self._take_fault("proxy-page", path.split("?", 1)[0][len("/api/v1"):])
            if f is None:
                return None
            self._save()
        status = int(f.get("status") or 502)
        title = NGINX_TITLES.get(status) or f"{status} {HTTPStatus(status).phrase}"
        return status, (f"<html>\r\n<head><title>{title}</title></head>\r\n<body>\r\n<center><h1>{title}</h1></center>"
                        "\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")

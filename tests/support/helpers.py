"""Build probe documents like remote/probe.py prints, from recorded tool outputs, for pure tests."""
from __future__ import annotations

import os
from pathlib import Path


DATA = Path(__file__).resolve().parents[1] / "data"


def smi(name: str) -> str:
    return (DATA / "nvidia-smi" / name).read_text()


def fact(value=None, ok=True, error=None):
    return {"ok": ok, "value": value, "seconds": 0.01} if ok else {"ok": False, "error": error, "seconds": 0.01}


def probe_doc(*, query: str | None = None, query_rc: int = 0, table: str | None = None, table_rc: int = 0,
              packages: dict | None = None, cuda: dict | None = None, imports: dict | None = None,
              env: dict | None = None, python_version: str = "3.10.12", disk_free_gb: float = 361.0,
              mem_total_gib: float = 221.0, user_checks: dict | None = None, smi_found: bool = True) -> dict:
    doc = {
        "probe_version": 1, "python_ok": True,
        "os": fact({"pretty": "Ubuntu 22.04.5 LTS", "id": "ubuntu", "version_id": "22.04", "kernel": "6.8.0-60-generic",
                    "arch": "x86_64", "hostname": "h100"}),
        "cpus": fact({"count": 26}),
        "memory": fact({"total_bytes": int(mem_total_gib * 2**30), "available_bytes": int(mem_total_gib * 0.9 * 2**30)}),
        "disk": fact({"path": "/home/ubuntu/One-Shot-RLVR", "measured_at": "/home/ubuntu/One-Shot-RLVR", "exists": True,
                      "total_bytes": 993 * 10**9, "free_bytes": int(disk_free_gb * 10**9)}),
        "python": fact({"version": python_version, "full": python_version, "executable": "/usr/bin/python3"}),
        "packages": fact(packages or {}),
        "env": fact(env or {}),
        "user_checks": fact(user_checks or {}),
        "seconds": 1.2,
    }
    if not smi_found:
        doc["nvidia_smi_query"] = fact({"found": False})
        doc["nvidia_smi"] = fact({"found": False})
    else:
        if query_rc == 0:
            doc["nvidia_smi_query"] = fact({"found": True, "rc": 0, "stdout": query or "", "stderr": ""})
        else:
            doc["nvidia_smi_query"] = fact({"found": True, "rc": query_rc, "stdout": query or "", "stderr": ""})
        doc["nvidia_smi"] = fact({"found": True, "rc": table_rc, "stdout": table or "", "stderr": ""})
    doc["nvcc"] = fact({"found": False})
    if cuda is not None:
        doc["cuda"] = fact({"rc": 0, "result": cuda, "stderr": ""})
    if imports is not None:
        doc["imports"] = fact({"rc": 0, "result": imports, "stderr": ""})
    return doc


def healthy_cuda(n: int = 1, cuda: str = "12.8", version: str = "2.9.0+cu128", cap: str = "9.0") -> dict:
    return {"imported": True, "version": version, "cuda": cuda, "available": True, "device_count": n,
            "devices": [{"index": i, "name": "NVIDIA H100 PCIe", "capability": cap, "matmul_ok": True, "matmul_ms": 3.1}
                        for i in range(n)], "bf16": True, "cudnn": 91002}


def record_another_host_key(port: int, kind: str = "ed25519") -> tuple[Path, list[str]]:
    """gpuops' known_hosts made to hold another key for 127.0.0.1:port (a host whose key changed); returns the
    file and the recorded key's `type base64` words."""
    import os
    import subprocess

    kh = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "known_hosts"
    kh.parent.mkdir(parents=True, exist_ok=True)
    other = Path(os.environ["HOME"]) / f"fake_{kind}_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(other)], check=True)
    pub = other.with_suffix(".pub").read_text().split()
    kh.write_text(f"[127.0.0.1]:{port} {pub[0]} {pub[1]}\n")
    return kh, pub


def record_and_replace_keys(config_dir: str, n: int, rounds: int) -> None:
    """A process recording and replacing host keys in gpuops' known_hosts (the lock test runs several at once;
    here, not in the test file, so a spawned process can import it)."""
    os.environ["GPUOPS_CONFIG_DIR"] = config_dir
    import paramiko

    from gpuops.remote import hostkeys

    key = paramiko.Ed25519Key.from_private_key_file(os.environ["GPUOPS_TEST_KEY"])
    for i in range(rounds):
        hostkeys.record(f"10.{n}.0.{i}", 22, key)
        hostkeys.replace(f"10.{n}.0.{i}", 22, key)  # forgets and records again: still one entry for it


# -- Ctrl-C in tests ---------------------------------------------------------------------------------------------------
# A suite started from a background job (nohup, a CI runner) runs with SIGINT ignored, and every child inherits that:
# a test that presses Ctrl-C gives its target the default handler itself.
def default_sigint() -> None:
    """preexec_fn for a child the test will send SIGINT: Python there turns it into KeyboardInterrupt again."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def python_sigint():
    """A context for a test that sends SIGINT to its own process (the CLI run in-process): Python's own handler."""
    import contextlib
    import signal

    @contextlib.contextmanager
    def ctx():
        old = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, old)

    return ctx()

"""gpuops' known_hosts is rewritten atomically under a lock (#8.1): processes recording and replacing keys at the
same moment lose no entry, and no reader ever sees half a file."""
from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from support.helpers import record_and_replace_keys


def test_parallel_records_and_replaces_lose_nothing(tmp_path, monkeypatch):
    import subprocess

    key = tmp_path / "k"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    monkeypatch.setenv("GPUOPS_TEST_KEY", str(key))
    cfg = tmp_path / "cfg"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=record_and_replace_keys, args=(str(cfg), n, 15)) for n in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    lines = (cfg / "known_hosts").read_text().splitlines()
    assert sorted(ln.split()[0] for ln in lines) == sorted(f"10.{n}.0.{i}" for n in range(6) for i in range(15))
    assert oct((cfg / "known_hosts").stat().st_mode & 0o777) == "0o600"
    assert not [p for p in Path(cfg).iterdir() if ".tmp" in p.name]  # no temporary file left behind


def test_record_never_adds_a_second_key_beside_one_recorded_meanwhile(tmp_path, monkeypatch):
    """Checked and recorded under one lock: when another gpuops recorded a key for the host between this
    connection's check and its record (first use from two terminals), a different key is refused, not added."""
    import subprocess

    import paramiko
    import pytest

    from gpuops.errors import HostKeyError
    from gpuops.remote import hostkeys

    monkeypatch.setenv("GPUOPS_CONFIG_DIR", str(tmp_path / "cfg"))
    keys = []
    for name in ("a", "b"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / name)], check=True)
        keys.append(paramiko.Ed25519Key.from_private_key_file(str(tmp_path / name)))
    hostkeys.record("10.0.0.1", 2222, keys[0])
    before = (tmp_path / "cfg" / "known_hosts").read_bytes()
    hostkeys.record("10.0.0.1", 2222, keys[0])  # the same key again: nothing added
    assert (tmp_path / "cfg" / "known_hosts").read_bytes() == before
    with pytest.raises(HostKeyError, match="CHANGED"):
        hostkeys.record("10.0.0.1", 2222, keys[1])
    assert (tmp_path / "cfg" / "known_hosts").read_bytes() == before

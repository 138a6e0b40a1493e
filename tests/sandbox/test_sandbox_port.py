"""`gpuops sandbox up` keeps its port across restarts, as docs/sandbox.md says (#8.10): known_hosts entries and
profiles naming it stay valid. Only if another program took the port meanwhile does it move, and says so."""
from __future__ import annotations

import json
import socket


def test_port_kept_across_restarts_and_moved_only_when_taken(starts_hosts, gpuops, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "own-state"))
    try:
        r = gpuops("sandbox", "up", "--json")
        assert r.code == 0, r.all
        port = json.loads(r.out)["port"]
        assert gpuops("sandbox", "down").code == 0
        r = gpuops("sandbox", "up", "--json")
        assert json.loads(r.out)["port"] == port, r.all
        assert gpuops("sandbox", "down").code == 0
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
            s.listen()
            r = gpuops("sandbox", "up")
            assert r.code == 0, r.all
            assert f"port {port} is taken" in r.err
        st = json.loads(gpuops("sandbox", "status", "--json").out)
        assert st["running"] and st["port"] != port
    finally:
        gpuops("sandbox", "down")

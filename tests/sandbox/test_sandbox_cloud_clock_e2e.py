"""`gpuops sandbox up --cloud --boot-seconds S` holds whether the emulator's state exists or its daemon runs already
(it used to keep the saved 20 s, so every `up` took 21 s)."""
from __future__ import annotations

import json
import urllib.request


def _clock(info: dict) -> dict:
    req = urllib.request.Request(info["url"].rsplit("/api/v1", 1)[0] + "/_emulator/state",
                                 headers={"Authorization": f"Bearer {info['api_key']}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())["data"]["clock"]


def test_boot_seconds_is_honoured_over_saved_state(starts_hosts, gpuops, monkeypatch, tmp_path):
    monkeypatch.setenv("GPUOPS_STATE_DIR", str(tmp_path / "state"))
    r = gpuops("sandbox", "up", "--cloud", "--json")  # the default: 20 s, saved in the state
    assert r.code == 0, r.all
    try:
        info = json.loads(r.out)
        assert _clock(info)["boot_seconds"] == 20.0
        r = gpuops("sandbox", "up", "--cloud", "--json", "--boot-seconds", "5", "--launch-window", "1")  # running
        assert r.code == 0, r.all
        assert json.loads(r.out)["url"] == info["url"]  # the same daemon
        assert (_clock(info)["boot_seconds"], _clock(info)["launch_window"]) == (5.0, 1.0)
        assert gpuops("sandbox", "down", "--cloud").code == 0
        r = gpuops("sandbox", "up", "--cloud", "--json", "--boot-seconds", "3")  # a new daemon, the state kept
        assert r.code == 0, r.all
        assert _clock(json.loads(r.out))["boot_seconds"] == 3.0
    finally:
        gpuops("sandbox", "down", "--cloud")

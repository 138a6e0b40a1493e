"""A fresh machine has no ~/.ssh/id_ed25519: `up` and `run` say how to create it (no profile exists yet to point
at another key), before any request to the API."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.mark.parametrize("given", [True, False])
@pytest.mark.parametrize("cmd", [["up", "rehearsal", "--type", "gpu_1x_h100_pcie", "--ttl", "1h", "--yes"],
                                 ["run", "--type", "gpu_1x_h100_pcie", "--script", "train.py", "--yes"]])
def test_a_missing_key_says_ssh_keygen(gpuops, monkeypatch, cmd, given):
    monkeypatch.setenv("LAMBDA_API_KEY", "secret_x")
    monkeypatch.setenv("GPUOPS_LAMBDA_API_URL", "http://127.0.0.1:1/api/v1")  # never asked
    (Path.cwd() / "train.py").write_text("print('hi')\n")
    key = Path.home() / ".ssh" / "id_ed25519"
    r = gpuops(*cmd, *(["--key", str(key)] if given else []))
    assert r.code == 2, r.all
    assert f"mkdir -p -m 700 {key.parent} && ssh-keygen -t ed25519 -f {key} -N ''" in r.err, r.err
    assert "profile" not in r.err and "Traceback" not in r.err, r.err

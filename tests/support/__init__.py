"""What the tests share, in one place: paths, polling, and the helpers of each area (one module per area).

The fixtures live in tests/conftest.py; a test file imports helpers from here, never from another test file.
`tests/` is on sys.path (pyproject: pythonpath), so a test writes `from support.runs import put`."""
from __future__ import annotations

import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]  # the repository
TESTS = ROOT / "tests"
DATA = TESTS / "data"  # recorded outputs: nvidia-smi, Lambda's OpenAPI examples, snapshots, logs


def wait_for(cond, timeout: float = 15, what: str = "condition", interval: float = 0.05, proc=None):
    """Poll `cond()` until it returns something true and return that; fail after `timeout` seconds, or at once when
    `proc` (a Popen the condition waits on) has ended first. Tests poll for evidence rather than sleep."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            got = cond()  # the evidence may have come with the end
            if got:
                return got
            raise AssertionError(f"the process ended (exit {proc.returncode}) before {what}: {proc.communicate()}")
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)

"""Every test that presses Ctrl-C gives its target Python's handler itself (tests/helpers.py: default_sigint for a
child, python_sigint in-process): a suite started from a background job (nohup, a CI runner) runs with SIGINT
ignored, and every child inherits that, so such a test would wait for an interrupt that never comes."""
from __future__ import annotations

import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
PRESS = re.compile(r"(send_signal|pthread_kill|os\.kill|killpg)\([^)]*SIGINT")


def test_every_test_that_sends_sigint_restores_its_handler():
    bad = []
    for f in sorted(HERE.glob("*.py")):
        text = f.read_text()
        if f.name == Path(__file__).name or not PRESS.search(text):
            continue
        if "default_sigint" not in text and "python_sigint" not in text:
            bad.append(f.name)
    assert not bad, f"these send SIGINT without giving the target its handler: {bad}"

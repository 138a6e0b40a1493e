"""Every test that presses Ctrl-C gives its target Python's handler itself (tests/support/helpers.py:
default_sigint for a child, python_sigint in-process, or a support helper that starts its child with default_sigint):
a suite started from a background job (nohup, a CI runner) runs with SIGINT ignored, and every child inherits that,
so such a test would wait for an interrupt that never comes."""
from __future__ import annotations

import ast
import re

from support import TESTS


PRESS = re.compile(r"(send_signal|pthread_kill|os\.kill|killpg)\([^)]*SIGINT")


def restoring_helpers() -> set[str]:
    """default_sigint, python_sigint and every function in tests/support/ that starts a child with default_sigint."""
    names = {"default_sigint", "python_sigint"}
    for f in (TESTS / "support").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.FunctionDef) and "default_sigint" in ast.unparse(node):
                names.add(node.name)
    return names


def test_every_test_that_sends_sigint_restores_its_handler():
    helpers = restoring_helpers()
    assert "run_process" in helpers  # support.pipeline's `gpuops run` child
    bad = []
    for f in sorted(TESTS.rglob("test_*.py")):
        text = f.read_text()
        if f.name == "test_ctrl_c_tests.py" or not PRESS.search(text):
            continue
        if not any(re.search(rf"\b{name}\b", text) for name in helpers):
            bad.append(str(f.relative_to(TESTS)))
    assert not bad, f"these send SIGINT without giving the target its handler: {bad}"

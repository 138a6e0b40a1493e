"""The suite's shape (tests/conftest.py, tests/support/): a test file imports shared code from tests/support/, never
from another test file (its fixtures would be imported twice, its helpers found only by reading every file), and
the shared helpers hold no tests."""
from __future__ import annotations

import ast

from support import TESTS


def test_no_test_file_imports_another():
    bad = []
    for f in sorted(TESTS.rglob("test_*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            bad += [f"{f.relative_to(TESTS)}: {n}" for n in names if n.split(".")[-1].startswith(("test_", "conftest"))]
    assert not bad, f"import shared code from tests/support/ instead: {bad}"


def test_support_holds_helpers_not_tests():
    assert not list((TESTS / "support").glob("test_*.py"))
    for f in (TESTS / "support").glob("*.py"):
        tree = ast.parse(f.read_text())
        tests = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]
        assert not tests, f"{f.name} defines tests: {tests}"

"""Every command page's synopsis (its first fenced block) names every option the command takes, and every page
says where `--debug` (which every command takes) is described."""
from __future__ import annotations

import re

import pytest

from support import ROOT


PAGES = {"verify": "verify", "trust": "trust", "sync": "sync", "fetch": "fetch", "train": "train", "watch": "watch",
         "logs": "logs", "status": "status", "stop": "stop", "snapshot": "snapshot", "diff": "diff",
         "matrix": "matrix", "up": "up", "ls": "ls", "down": "down", "reap": "reap", "run": "run", "setup": "setup",
         "plan": "plan"}


def _command(name: str):
    import typer

    from gpuops.cli.main import app

    return typer.main.get_command(app).commands[name]


def _synopsis(page: str) -> str:
    text = (ROOT / "docs" / f"{page}.md").read_text()
    m = re.search(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    assert m, f"docs/{page}.md has no synopsis block"
    return m.group(1)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_the_synopsis_names_every_option(name):
    syn = _synopsis(PAGES[name])
    missing = []
    for p in _command(name).params:
        if getattr(p, "hidden", False) or not getattr(p, "opts", None) or p.param_type_name != "option":
            continue
        names = list(p.opts) + list(p.secondary_opts)  # `-p PROFILE` or `--profile`: either says it
        if not any(re.search(r"(?<![\w-])" + re.escape(o) + r"(?![\w-])", syn) for o in names):
            missing.append(max(names, key=len))
    missing = [o for o in missing if o not in ("--help",)]
    assert not missing, f"docs/{PAGES[name]}.md's synopsis lacks {missing}"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_every_page_says_where_debug_is(name):
    text = (ROOT / "docs" / f"{PAGES[name]}.md").read_text()
    assert "--debug" in text, f"docs/{PAGES[name]}.md does not mention --debug"


def test_the_every_command_section_describes_debug():
    text = (ROOT / "docs" / "index.md").read_text()
    section = text.split("## Every command", 1)
    assert len(section) == 2 and "--debug" in section[1] and "--help" in section[1]

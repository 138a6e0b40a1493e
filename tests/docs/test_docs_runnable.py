"""The docs run as printed: every command block of README.md and docs/*.md marked runnable (an HTML comment
`<!-- runnable ... -->` on the line before its fence, invisible when rendered) is run, command by command, in one
bash shell, as a new user would paste it: a fresh HOME, XDG_CONFIG_HOME and XDG_STATE_HOME, an empty project
folder, `gpuops` on PATH. Each command must exit 0, or the code its comment names (`# exit 1: ...`). A block whose
lines start with `$ ` shows output too: only the `$ ` lines are commands. Whatever a block starts is stopped at the
end (`gpuops sandbox down`, `sandbox down --cloud`), in this test's own state only.

This is what `.ci/run` does for the README's Quickstart, for every other page a marker names."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import ROOT


MARK = re.compile(r"^<!--\s*runnable\b")
EXIT = re.compile(r"#\s*exit (\d+)\b")


@dataclass
class Command:
    line: int  # where it starts in its page
    text: str
    exit: int


@dataclass
class Block:
    page: str
    line: int
    commands: list


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def commands_of(lines: list[str], first: int) -> list[Command]:
    """A block's commands: `$ ` lines when it shows output, else every line that is not a comment; a line ending
    with a backslash continues on the next, a here-document runs to its terminator."""
    prompt = any(ln.startswith("$ ") for ln in lines)
    out, i = [], 0
    while i < len(lines):
        ln, at = lines[i], first + i
        i += 1
        if prompt:
            if not ln.startswith("$ "):
                continue
            ln = ln[2:]
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        text = [ln]
        while text[-1].endswith("\\") and i < len(lines):
            text.append(lines[i][2:] if prompt and lines[i].startswith("$ ") else lines[i])
            i += 1
        here = re.search(r"<<-?\s*'?\"?(\w+)'?\"?", "\n".join(text))
        if here:
            while i < len(lines) and lines[i].strip() != here.group(1):
                text.append(lines[i])
                i += 1
            if i < len(lines):
                text.append(lines[i])
                i += 1
        m = EXIT.search(text[0])
        out.append(Command(at, "\n".join(text), int(m.group(1)) if m else 0))
    return out


def runnable_blocks() -> list[Block]:
    blocks = []
    for page in pages():
        lines = page.read_text().splitlines()
        for n, ln in enumerate(lines):
            if not MARK.match(ln):
                continue
            assert n + 1 < len(lines) and lines[n + 1].startswith("```"), \
                f"{page.name}:{n + 1}: a runnable mark must stand right before a fenced block"
            end = next(k for k in range(n + 2, len(lines)) if lines[k].startswith("```"))
            blocks.append(Block(str(page.relative_to(ROOT)), n + 3, commands_of(lines[n + 2:end], n + 3)))
    return blocks


def script_of(block: Block) -> str:
    """One bash script: each command in braces, its exit code checked; the sandboxes it may start stopped at exit."""
    parts = ["trap 'gpuops sandbox down --cloud >/dev/null 2>&1; gpuops sandbox down >/dev/null 2>&1' EXIT"]
    for c in block.commands:
        where = f"{block.page}:{c.line}"
        parts.append(f"echo '>>> {where}' >&2\n{{ {c.text}\n}}\ngpuops_rc=$?\n"
                     f"if [ $gpuops_rc -ne {c.exit} ]; then echo \"DOC FAILED {where}: exit $gpuops_rc, expected "
                     f"{c.exit}\" >&2; exit 1; fi")
    return "\n".join(parts) + "\n"


def clean_env(tmp: Path) -> dict:
    home = tmp / "newuser"
    home.mkdir()
    env = {"HOME": str(home), "XDG_CONFIG_HOME": str(tmp / "config"), "XDG_STATE_HOME": str(tmp / "state"),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/local/bin", "/usr/bin", "/bin",
                                    "/usr/sbin", "/sbin"]),
           "LANG": "C.UTF-8", "NO_COLOR": "1", "TERM": "dumb"}
    return env


BLOCKS = runnable_blocks()


def test_the_docs_mark_blocks_to_run():
    assert {b.page for b in BLOCKS} >= {"docs/sandbox.md", "docs/verify.md"}, BLOCKS
    assert all(b.commands for b in BLOCKS)


def test_commands_of_reads_prompts_continuations_heredocs_and_exit_codes():
    got = commands_of(["$ gpuops verify sandbox   # exit 1: FAIL", "output line", "$ a \\", "  b",
                       "cat > f <<'EOF'", "x", "EOF", "# a comment", "tail"], 10)
    assert [(c.line, c.text, c.exit) for c in got] == [(10, "gpuops verify sandbox   # exit 1: FAIL", 1),
                                                       (12, "a \\\n  b", 0)]
    got = commands_of(["cat > f <<'EOF'", "x", "EOF", "# a comment", "tail -n 1 f"], 1)
    assert [c.text for c in got] == ["cat > f <<'EOF'\nx\nEOF", "tail -n 1 f"]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.line}" for b in BLOCKS])
def test_a_runnable_block_runs_as_printed(block, starts_hosts, tmp_path):
    assert shutil.which("bash")
    project = tmp_path / "project"
    project.mkdir()
    script = tmp_path / "block.sh"
    script.write_text(script_of(block))
    p = subprocess.run(["bash", str(script)], cwd=project, env=clean_env(tmp_path), capture_output=True, text=True,
                       timeout=600, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"{block.page}:{block.line}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-6000:]}"

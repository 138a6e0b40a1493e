"""Run the probe on the remote host: ONE remote execution for every fact.

The probe source (remote/probe_scripts.py, then remote/probe.py) goes over the channel's stdin to `<python> -`, with a
PARAMS line prepended; nothing of it reaches the remote command line. A host without that Python still answers:
a shell fallback reports the missing interpreter and nvidia-smi's raw output in the same execution.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

from ..errors import RemoteError
from .probe import SMI_FIELDS

NO_PYTHON_MARK = "@@gpuops-no-python"


PROBE_FILES = ("probe_scripts.py", "probe.py")  # one source: the child scripts the probe starts, then the probe


def probe_source(params: dict) -> str:
    src = "".join((Path(__file__).parent / name).read_text() for name in PROBE_FILES)
    return f"import json\nPARAMS = json.loads({json.dumps(json.dumps(params))})\n" + src


def command(python: str) -> str:
    from .shell import shell_command, shell_path

    py = shell_command(python)
    first = shell_path((shlex.split(python) or ["python3"])[0])
    smi_q = shlex.quote(f"--query-gpu={SMI_FIELDS}")
    t = 'T=""; command -v timeout >/dev/null 2>&1 && T="timeout 20"'
    return (
        f"if command -v {first} >/dev/null 2>&1; then exec {py} -; fi; "
        f"echo {NO_PYTHON_MARK}; {t}; "
        "if command -v nvidia-smi >/dev/null 2>&1; then "
        f"o=$($T nvidia-smi {smi_q} --format=csv,noheader,nounits 2>&1); echo \"@@smi_query $?\"; printf '%s\\n' \"$o\"; "
        "o=$($T nvidia-smi 2>&1); echo \"@@smi $?\"; printf '%s\\n' \"$o\"; fi; "
        "echo \"@@os\"; uname -r; uname -m; cat /etc/os-release 2>/dev/null | sed -n 's/^PRETTY_NAME=//p'"
    )


def _parse_fallback(text: str, python: str) -> dict:
    facts: dict = {"python_ok": False, "python_missing": python}
    sections: dict[str, tuple[int | None, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@") and line != NO_PYTHON_MARK:
            name, _, rc = line[2:].partition(" ")
            current = name
            sections[name] = (int(rc) if rc.strip().lstrip("-").isdigit() else None, [])
        elif current:
            sections[current][1].append(line)
    for key, name in (("smi_query", "nvidia_smi_query"), ("smi", "nvidia_smi")):
        if key in sections:
            rc, lines = sections[key]
            out = "\n".join(lines) + "\n"
            facts[name] = {"ok": True, "value": {"found": True, "rc": rc, "stdout": out if rc == 0 else "",
                                                 "stderr": "" if rc == 0 else out}}
        else:
            facts[name] = {"ok": True, "value": {"found": False}}
    if "os" in sections:
        lines = sections["os"][1] + ["", "", ""]
        facts["os"] = {"ok": True, "value": {"kernel": lines[0], "arch": lines[1], "pretty": lines[2].strip('"') or None}}
    return facts


def gather(remote, params: dict, *, python: str, timeout: float = 180.0) -> dict:
    """Run the probe once; return the raw facts document (see remote/probe.py)."""
    res = remote.run(command(python), stdin=probe_source(params), timeout=timeout)
    text = res.stdout
    if text.startswith(NO_PYTHON_MARK):
        return _parse_fallback(text, python)
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    detail = (res.stderr.strip().splitlines() or ["no output"])[-1]
    raise RemoteError(f"the environment probe failed on {remote.profile.host} (exit {res.rc}) with {python}: {detail}",
                      hint="remote Python must be >= 3.8; set 'python:' in the profile to another interpreter")

"""Profile YAML text, written by `gpuops profiles new` and `gpuops profiles pin`. Pure: values (and a host's facts)
in, commented text out; the caller passes the text through the same gate as a hand-written profile
(profiles.profile_from_text) before it is written.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field

# what --from-host and pin record when the host has it (verify imports flash_attn itself when it is installed)
PIN_PACKAGES = ("torch", "torchvision", "torchaudio", "vllm", "flash-attn")
MEMORY_SLACK = 0.97  # nvidia-smi reports a little less than the datasheet, and boards differ by a few hundred MiB
EXPECT_ORDER = ("gpu", "gpu_count", "gpu_memory_mib", "driver", "cuda", "python", "packages", "imports",
                "min_disk_gb", "min_memory_gib")


@dataclass
class Expectations:
    """expect: values with one comment each (key -> note), and what could not be recorded (warnings)."""
    values: dict = field(default_factory=dict)
    notes: dict = field(default_factory=dict)
    warnings: list = field(default_factory=list)
    preset: str | None = None
    preset_note: str | None = None


def q(value) -> str:
    """A YAML scalar: strings double-quoted (JSON strings are valid YAML), numbers as they are."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(str(value))


def _smi_short(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3': a substring of what nvidia-smi prints, and a name gpus.yaml knows."""
    return re.sub(r"^(NVIDIA|Tesla)\s+", "", name.strip())


def _major_minor(version: str | None) -> str | None:
    m = re.match(r"(\d+)\.(\d+)", version or "")
    return f"{m.group(1)}.{m.group(2)}" if m else None


def from_gpu_row(row, count: int, instance_type: str) -> Expectations:
    """What an instance type promises, from its row in gpus.yaml."""
    e = Expectations()
    smi = row.smi_names[0] if row.smi_names else row.name
    e.values["gpu"] = _smi_short(smi)
    e.notes["gpu"] = f"{row.name} on {instance_type}, as nvidia-smi names it (playbooks/gpus.yaml)"
    e.values["gpu_count"] = count
    if row.memory_mib:
        e.values["gpu_memory_mib"] = int(row.memory_mib * MEMORY_SLACK)
        e.notes["gpu_memory_mib"] = f"{row.memory_mib:,} MiB per GPU in gpus.yaml, less 3 %"
    if row.preset:
        e.preset = row.preset
        e.preset_note = f"the env preset for {row.architecture or row.name} (playbooks/presets.yaml)"
    return e


def from_facts(facts, *, packages: tuple = PIN_PACKAGES, match=None) -> Expectations:
    """What the host has now, as expectations (gpuops.verify.facts.Facts in). `match(name) -> row|None` names the preset."""
    e = Expectations()
    gpus = facts.gpus
    if facts.smi.state == "ok" and gpus:
        names = sorted({g.name for g in gpus})
        if len(names) == 1:
            e.values["gpu"] = _smi_short(names[0])
            e.notes["gpu"] = f"nvidia-smi: {names[0]}"
            row = match(names[0]) if match else None
            if row is not None and row.preset:
                e.preset = row.preset
                e.preset_note = f"the env preset for {row.name} (playbooks/presets.yaml)"
        else:
            e.warnings.append(f"the GPUs differ ({', '.join(names)}): expect.gpu not written")
        e.values["gpu_count"] = len(gpus)
        mems = [g.memory_total_mib for g in gpus if g.memory_total_mib]
        if mems and len(mems) == len(gpus):
            e.values["gpu_memory_mib"] = int(min(mems) * MEMORY_SLACK)
            e.notes["gpu_memory_mib"] = f"{min(mems):,.0f} MiB reported, less 3 %"
    elif facts.smi.state == "missing":
        e.warnings.append("nvidia-smi was not found on the host: no GPU expectations written")
    else:
        e.warnings.append(f"nvidia-smi failed ({facts.smi.title or facts.smi.state}): no GPU expectations written")
    if facts.driver and gpus:
        e.values["driver"] = facts.driver
    rt = facts.cuda_runtime or {}
    if rt.get("cuda"):
        e.values["cuda"] = _major_minor(rt["cuda"]) or rt["cuda"]
        e.notes["cuda"] = f"torch {rt.get('version', '')} is built for CUDA {rt['cuda']}".replace("torch  ", "torch ")
    elif facts.cuda_driver and gpus:
        e.values["cuda"] = _major_minor(facts.cuda_driver) or facts.cuda_driver
        e.notes["cuda"] = "the CUDA version the driver supports (no CUDA build of torch found)"
    if not facts.python_ok:
        e.warnings.append(f"'{facts.python_missing}' was not found on the host: no Python or package expectations")
        return e
    v = (facts.python or {}).get("version")
    if v:
        e.values["python"] = _major_minor(v) or v
        e.notes["python"] = f"{v} at {(facts.python or {}).get('executable') or '?'}"
    pins = {n: facts.packages.get(n) for n in packages if facts.packages.get(n)}
    if pins:
        e.values["packages"] = pins
    return e


def merge_expect(old: dict, new: Expectations) -> dict:
    """pin: the new values over the old expect: (packages merged; thresholds the host cannot tell, kept)."""
    merged = {k: v for k, v in old.items() if v not in (None, {}, [])}
    for k, v in new.values.items():
        if k == "packages":
            merged["packages"] = {**(old.get("packages") or {}), **v}
        else:
            merged[k] = v
    return merged


def expect_block(values: dict, notes: dict | None = None, *, commented: dict | None = None) -> list[str]:
    """The `expect:` lines. `commented`: key -> (example, note) written as a comment where no value is set."""
    notes, commented = notes or {}, commented or {}
    lines = ["expect:"]
    for k in list(EXPECT_ORDER) + [k for k in values if k not in EXPECT_ORDER]:
        if k in values:
            v = values[k]
            if k == "packages":
                lines.append("  packages:")
                lines += [f"    {name}: {q(spec)}" for name, spec in v.items()]
            elif k == "imports":
                lines.append(f"  imports: [{', '.join(q(x) for x in v)}]")
            else:
                note = f"   # {notes[k]}" if k in notes else ""
                lines.append(f"  {k}: {q(v)}{note}")
        elif k in commented:
            example, note = commented[k]
            lines.append(f"  # {k}: {example}   # {note}")
    if not values:
        lines[0] = "expect: {}   # nothing expected yet"
    return lines


TODO_PIN = {"driver": ('">=570"', "record the stack that works: gpuops profiles pin NAME"),
            "cuda": ('"12.8"', "the CUDA your torch is built for"),
            "python": ('"3.10"', "the remote Python"),
            "packages": ('{torch: "2.9.0"}', "name -> version; \"*\" = installed"),
            "min_disk_gb": ("100", "free disk at remote_dir")}


def render(name: str, *, host: str, user: str, port: int, key: str | None, remote_dir: str | None,
           python: str, instance_type: str | None, expect: Expectations, written_by: str,
           price: tuple[float | None, str] = (None, "")) -> str:
    """A whole profile, every key commented. Pure."""
    todo = {k: (ex, note.replace("NAME", name)) for k, (ex, note) in TODO_PIN.items()}
    out = [f"# gpuops profile '{name}', written by `{written_by}`. Every key: docs/profiles.md",
           f"# Check the host against it: gpuops verify {name}",
           f"host: {q(host)}",
           f"user: {q(user)}",
           f"port: {port}"]
    out.append(f"key: {q(key)}   # private key, readable by you only (chmod 600)" if key else
               "# key: \"~/.ssh/id_ed25519\"   # none given: ssh-agent and ~/.ssh/id_* are tried")
    out.append(f"remote_dir: {q(remote_dir)}" if remote_dir else
               "# remote_dir: \"~/project\"   # default: ~/<the local project folder's name>")
    if python == "python3":  # the default: left out, so `gpuops setup` may make ~/.venvs/gpuops and write it here
        out.append('# python: "~/venv/bin/python"   # the remote interpreter you train with; default: the system python3 '
                   "(gpuops setup makes ~/.venvs/gpuops, which sees its packages, and writes it here)")
    else:
        out.append(f"python: {q(python)}   # the remote interpreter you train with (e.g. ~/venv/bin/python)")
    if instance_type:
        out.append(f"instance_type: {q(instance_type)}")
    if price[0] is not None:
        out.append(f"price_per_hour: {price[0]:g}   # USD, from {price[1]}: watch and status show the cost so far")
    out.append("host_key_policy: accept-new   # trust on first use; a changed host key is refused")
    out += expect_block(expect.values, expect.notes, commented=todo)
    if expect.preset:
        out.append(f"env_preset: {expect.preset}   # {expect.preset_note}")
    else:
        out.append("# env_preset: h100   # h100, ada, blackwell-b200, blackwell-rtxpro or blackwell: environment for `gpuops train` (docs/playbooks.md)")
    out.append("# secrets: [WANDB_API_KEY, HF_TOKEN]   # sent to training jobs, never on a command line")
    out.append("fetch:   # name -> path under remote_dir, for `gpuops fetch NAME`")
    out.append("  checkpoints: checkpoints")
    return "\n".join(out) + "\n"


def replace_expect(text: str, values: dict, notes: dict | None = None) -> str:
    """The profile text with its top-level `expect:` block replaced (appended when absent); every other line, and
    its comments, kept as they were."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if re.match(r"expect\s*:", ln)), None)
    block = expect_block(values, notes)
    if start is None:
        body = lines + block
    else:
        end = start + 1
        while end < len(lines) and (lines[end][:1] in (" ", "\t") or not lines[end].strip()):
            end += 1
        while end > start + 1 and not lines[end - 1].strip():  # blank lines before the next key stay outside
            end -= 1
        body = lines[:start] + block + lines[end:]
    return "\n".join(body) + "\n"


def diff(old: str, new: str, path: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                        fromfile=path, tofile=path + " (pinned)"))

"""Snapshots compared (pure): what changed from one environment to another (`gpuops diff`: the system's versions and
every package by its normalized PEP 503 name, a field one snapshot never recorded said so, not counted), and the
environment matrix (`gpuops matrix`: each component's version in every snapshot, with how it was verified, in
Markdown for a project's docs). The snapshots are transfer/snapshot.py's documents (environment.json); this module
only reads them.
"""
from __future__ import annotations

from typing import Any

from .snapshot import gpu_line, normalize


# -- diff ----------------------------------------------------------------------------------------------------
SYSTEM = [  # (key, label, the keys it is read from, value)
    ("python", "Python", ("python_version_short", "python_version"), lambda s: s.get("python_version_short")),
    ("os", "OS", ("os_name",), lambda s: s.get("os_name")),
    ("cuda", "CUDA (PyTorch build)", ("cuda_version",), lambda s: s.get("cuda_version")),
    ("cudnn", "cuDNN", ("cudnn_version",), lambda s: s.get("cudnn_version")),
    ("driver", "NVIDIA driver", ("driver_version",), lambda s: s.get("driver_version")),
    ("cuda_driver", "CUDA (driver supports)", ("cuda_driver_version",), lambda s: s.get("cuda_driver_version")),
    ("gpu", "GPUs", ("gpu_count", "gpu_name"),
     lambda s: f"{s['gpu_count']} x {s.get('gpu_name')}" if s.get("gpu_count") else s.get("gpu_name") or "none"),
]


def diff(a: dict, b: dict) -> dict:
    """What changed from a to b. Packages are matched by their normalized (PEP 503) names.

    A field one snapshot never recorded (an environment.json written by another tool) is shown as
    "not recorded" and does not count as a difference; None (e.g. no torch, so no CUDA) does.
    """
    system = []
    for key, label, keys, get in SYSTEM:
        rec_a, rec_b = any(k in a for k in keys), any(k in b for k in keys)
        va, vb = get(a), get(b)
        entry = {"field": key, "label": label, "a": va, "b": vb, "changed": rec_a and rec_b and va != vb}
        if not (rec_a and rec_b):
            entry["not_recorded"] = "a" if not rec_a else "b"
        system.append(entry)
    pa = {normalize(k): (k, v) for k, v in (a.get("packages") or {}).items()}
    pb = {normalize(k): (k, v) for k, v in (b.get("packages") or {}).items()}
    added = sorted(([pb[n][0], pb[n][1]] for n in pb.keys() - pa.keys()), key=lambda x: x[0].lower())
    removed = sorted(([pa[n][0], pa[n][1]] for n in pa.keys() - pb.keys()), key=lambda x: x[0].lower())
    changed = sorted(([pb[n][0], pa[n][1], pb[n][1]] for n in pa.keys() & pb.keys() if pa[n][1] != pb[n][1]),
                     key=lambda x: x[0].lower())
    sys_changed = [s for s in system if s["changed"]]
    return {
        "identical": not (sys_changed or added or removed or changed),
        "system": system,
        "added": added,
        "removed": removed,
        "changed": changed,
        "unchanged_packages": len(pa.keys() & pb.keys()) - len(changed),
        "python_version_changed": system[0]["changed"],
        "cuda_version_changed": system[2]["changed"],
        "driver_changed": system[4]["changed"],
        "gpu_changed": system[6]["changed"],
    }


def _shown(v: Any) -> str:
    return "none" if v is None else str(v)


def render_diff(d: dict, a_label: str, b_label: str) -> list[str]:
    if d["identical"]:
        return [f"identical: {a_label} and {b_label} have the same Python, CUDA, driver, GPUs and "
                f"{d['unchanged_packages']} packages"]
    lines = [f"Environment differences: {a_label} -> {b_label}", ""]
    for s in d["system"]:
        if s["a"] is None and s["b"] is None:
            continue
        if s.get("not_recorded"):
            va = "not recorded" if s["not_recorded"] == "a" else _shown(s["a"])
            vb = "not recorded" if s["not_recorded"] == "b" else _shown(s["b"])
            lines.append(f"  {s['label']}: {va} -> {vb}  (not compared)")
        elif s["changed"]:
            lines.append(f"  {s['label']}: {_shown(s['a'])} -> {_shown(s['b'])}")
        else:
            lines.append(f"  {s['label']}: {_shown(s['a'])}  (same)")
    lines.append("")
    if d["changed"]:
        lines.append(f"Changed packages ({len(d['changed'])}):")
        lines += [f"  ~ {n}: {old} -> {new}" for n, old, new in d["changed"]]
    if d["added"]:
        lines.append(f"Added packages ({len(d['added'])}):")
        lines += [f"  + {n}=={v}" for n, v in d["added"]]
    if d["removed"]:
        lines.append(f"Removed packages ({len(d['removed'])}):")
        lines += [f"  - {n}=={v}" for n, v in d["removed"]]
    if not (d["changed"] or d["added"] or d["removed"]):
        lines.append(f"Packages: the same {d['unchanged_packages']}")
    else:
        lines.append(f"Unchanged packages: {d['unchanged_packages']}")
    return lines


# -- matrix --------------------------------------------------------------------------------------------------
MATRIX_ROWS = [  # (component, value, how verified)
    ("OS", lambda s: " ".join(x for x in (s.get("os_name"), f"(kernel {s['os_release']})" if s.get("os_release") else None) if x) or None,
     "`cat /etc/os-release`; `uname -r`"),
    ("Python", lambda s: s.get("python_version_short"), "`python -V`"),
    ("PyTorch", lambda s: s.get("torch_version"), "`python -c \"import torch; print(torch.__version__)\"`"),
    ("torchvision", lambda s: s.get("torchvision_version"), "`python -c \"import torchvision; print(torchvision.__version__)\"`"),
    ("torchaudio", lambda s: s.get("torchaudio_version"), "`python -c \"import torchaudio; print(torchaudio.__version__)\"`"),
    ("transformers", lambda s: s.get("transformers_version"), "`pip show transformers`"),
    ("NumPy", lambda s: s.get("numpy_version"), "`pip show numpy`"),
    ("CUDA runtime", lambda s: f"{s['cuda_version']} (PyTorch wheels)" if s.get("cuda_version") else None,
     "`python -c \"import torch; print(torch.version.cuda)\"`"),
    ("cuDNN", lambda s: s.get("cudnn_version"), "`python -c \"import torch; print(torch.backends.cudnn.version())\"`"),
    ("NVIDIA driver", lambda s: s.get("driver_version"), "`nvidia-smi --query-gpu=name,driver_version --format=csv`"),
    ("CUDA (driver max)", lambda s: s.get("cuda_driver_version"), "`nvidia-smi` header"),
    ("GPUs", lambda s: gpu_line(s) if s.get("gpu_count") else None, "`nvidia-smi --query-gpu=name,memory.total --format=csv`"),
]


def matrix(snaps: list[tuple[str, dict]]) -> dict:
    """Rows (component, one value per snapshot, how verified); rows with no value anywhere are left out."""
    rows = []
    for comp, get, how in MATRIX_ROWS:
        vals = [get(s) for _, s in snaps]
        if any(v for v in vals):
            rows.append({"component": comp, "versions": vals, "verified": how})
    return {"columns": [label for label, _ in snaps], "rows": rows,
            "sources": [{"label": label, "captured_at": s.get("captured_at"), "path": s.get("_path"),
                         "packages": len(s.get("packages") or {})} for label, s in snaps]}


def _cell(v: Any) -> str:
    return "—" if v in (None, "") else str(v).replace("|", "\\|")


def render_matrix(m: dict) -> str:
    cols = m["columns"]
    if len(cols) == 1:
        head = ["| Component | Version | How verified |", "|-----------|---------|--------------|"]
    else:
        head = ["| Component | " + " | ".join(_cell(c) for c in cols) + " | How verified |",
                "|-----------|" + "|".join("-" * (len(c) + 2) for c in cols) + "|--------------|"]
    body = [f"| {r['component']} | " + " | ".join(_cell(v) for v in r["versions"]) + f" | {r['verified']} |"
            for r in m["rows"]]
    notes = [""]
    for s in m["sources"]:
        how = f"saved snapshot {s['path']}" if s.get("path") else "live `gpuops snapshot`"
        notes.append(f"- {s['label']}: {how}, captured {s['captured_at']} ({s['packages']} packages)")
    return "\n".join(["## Environment matrix", ""] + head + body + notes) + "\n"

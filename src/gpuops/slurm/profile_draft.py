"""`gpuops profiles new NAME --slurm --host LOGIN`: a profile for a Slurm cluster written from what its login node's
sinfo and scontrol say (partitions, the default one, GPUs per node from gres, node counts, the default and maximum
time). draft() and slurm_block() are pure; new_profile() is the talking half (one connection, one execution: the same
facts verify reads, slurm/cluster.login_facts).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..errors import ProfileError, UsageError
from .cluster_checks import Partition, partitions


@dataclass
class Draft:
    partition: Partition
    gpus_per_node: int = 0
    gpu_type: Optional[str] = None
    time: Optional[str] = None
    notes: list = field(default_factory=list)  # comment lines above `slurm:`
    others: list = field(default_factory=list)  # the other partitions, for a comment


def draft(nodes, records, partition: Optional[str] = None) -> Draft:
    """The `slurm:` values for `partition` (default: the cluster's default partition)."""
    parts = partitions(nodes, records)
    names = [p.name + (" (default)" if p.default else "") for p in parts.values()]
    if partition:
        part = parts.get(partition)
        if part is None:
            raise UsageError(f"--partition {partition!r}: the cluster has no such partition (its partitions: "
                             f"{', '.join(names) or 'none'})")
    else:
        part = next((p for p in parts.values() if p.default), None) or next(iter(parts.values()), None)
        if part is None:
            raise ProfileError("the login node's sinfo lists no partition", hint="run `sinfo` there: is it a Slurm "
                                                                                "cluster's login node?")
    gpus = Counter(n.gpus for n in part.nodes)
    per_node = gpus.most_common(1)[0][0] if gpus else 0
    kinds = Counter(n.gpu_type for n in part.nodes if n.gpu_type)
    d = Draft(partition=part, gpus_per_node=per_node, others=[n for n in names if not n.startswith(part.name + " ")
                                                               and n != part.name])
    if len(kinds) > 1:
        d.notes.append(f"its nodes name several GPU types ({', '.join(sorted(kinds))}): set gpu_type: to pick one")
    if len(gpus) > 1:
        d.notes.append("its nodes offer different GPU counts (" + ", ".join(f"{k} on {v} node(s)" for k, v in
                                                                           sorted(gpus.items())) + ")")
    if part.default_time and part.default_time.upper() not in ("NONE", "UNLIMITED"):
        d.time = part.default_time
    return d


def slurm_block(d: Draft, *, written_from: str) -> list[str]:
    """The commented `slurm:` section of the profile."""
    p = d.partition
    usable = sum(1 for n in p.nodes if n.usable)
    lines = [f"# The cluster as {written_from} said it: partition {p.name}{' (the default)' if p.default else ''}, "
             f"{len(p.nodes)} nodes ({usable} usable now), gres {', '.join(sorted({n.gres or 'none' for n in p.nodes}))}"
             + (f", MaxTime {p.max_time}" if p.max_time else "")]
    if d.others:
        lines.append(f"# Other partitions: {', '.join(d.others)}")
    lines += [f"# {n}" for n in d.notes]
    lines += ["slurm:",
              f"  partition: {p.name}",
              "  nodes: 1   # nodes per job (and verified by `gpuops verify`); the partition has " + str(len(p.nodes)),
              f"  gpus_per_node: {d.gpus_per_node}   # --gres=gpu:N per node, from the nodes' gres"]
    if d.gpu_type:
        lines.append(f"  gpu_type: {d.gpu_type}")
    if d.time:
        lines.append(f"  time: \"{d.time}\"   # the partition's default time limit" +
                     (f" (its maximum: {p.max_time})" if p.max_time else ""))
    else:
        lines.append("  # time: \"04:00:00\"   # the job's time limit ([D-]HH:MM:SS); none set: the partition's "
                     f"default{' (MaxTime ' + p.max_time + ')' if p.max_time else ''}")
    lines += ["  # account: my-lab   # if the cluster bills accounts",
              "  # qos: normal",
              "  # exclude: [n3]   # nodes to keep jobs off (verify names a failing node)",
              "  # price_per_gpu_hour: 2.49   # for the cost beside the GPU-hours"]
    return lines


def new_profile(out, *, name: str, dest: Path, host: str, key: Optional[Path], user: str, port: int,
                remote_dir: Optional[str], python: str, partition: Optional[str], project_dir: Path) -> Path:
    """Connect to the login node once, read the cluster and write the profile to `dest` (the caller has checked the
    name, the key and that `dest` may be written); validated first."""
    from ..paths import write_atomic
    from ..profiles import model as profiles
    from ..profiles import text as pt
    from ..remote.connection import connect
    from .cluster import login_facts

    home = str(Path.home()).rstrip("/") + "/"
    if remote_dir and remote_dir.startswith(home):
        remote_dir = "~/" + remote_dir[len(home):]
    base = pt.render(name, host=host, user=user, port=port, key=str(key) if key else None, remote_dir=remote_dir,
                     python=python, instance_type=None, expect=pt.Expectations(),
                     written_by=f"gpuops profiles new --slurm --host {host}")
    prof = profiles.profile_from_text(base, dest, project_dir)
    with out.status(f"connecting to the login node {user}@{host}:{port}"):
        remote = connect(prof, announce=out.info)
    try:
        with out.status("reading the cluster (sinfo, scontrol)"):
            facts = login_facts(remote)
    finally:
        remote.close()
    d = draft(facts.nodes, facts.partitions, partition)
    shared = ("# remote_dir must be on the filesystem the login node and every node share (jobs run there, verify's "
              "probe is written there):\n# your home is on most clusters" + (f" ({facts.home})" if facts.home else "")
              + "; else set it to the cluster's shared or scratch folder.")
    lines = base.rstrip("\n").splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.lstrip("# ").startswith("remote_dir:")), len(lines))
    lines[at:at] = shared.splitlines()
    lines += slurm_block(d, written_from=f"sinfo on {host}" + (f" (Slurm {facts.version})" if facts.version else ""))
    text = "\n".join(lines) + "\n"
    profiles.profile_from_text(text, dest, project_dir)  # the hand-written profile's gate, before writing
    write_atomic(dest, text)
    for n in d.notes:
        out.warn(n)
    return dest

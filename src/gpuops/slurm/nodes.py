"""The cluster's nodes as Slurm reports them (pure, stdlib only): sinfo (its node-oriented format, `sinfo -R`,
`sinfo --json` of 22.05 and of 23.02 on) and `scontrol show node`, each node with its state and flag characters,
its gres and GPUs, and for a drained or down node Slurm's reason, who set it and when; and the nodes that failed a
job. Verify on a cluster reads these (the partition's nodes, a drained node named with its reason); a job's own
states are slurm/states.py's."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable, Optional

from .states import SlurmEnding, _int, _jnum, _split_top, _time, _user, epoch_text, expand_hostlist, split_fields

# one line per node and partition: node, partition (the default one ends with *), state with its flag characters,
# gres, CPUs, memory (MB), who set the reason and when, the reason (last: free text, so a split keeps it whole)
SINFO_FIELDS = ("node", "partition", "state", "gres", "cpus", "memory_mb", "reason_user", "reason_time", "reason")
SINFO_FORMAT = "%N|%P|%T|%G|%c|%m|%u|%H|%E"


def sinfo_argv(partition: Optional[str] = None) -> list[str]:
    return ["sinfo", "--noheader", "--Node", f"--format={SINFO_FORMAT}"] + (
        [f"--partition={partition}"] if partition else [])


def gres_gpus(gres: Optional[str]) -> tuple[int, Optional[str]]:
    """(GPUs, their type) in a gres string: `gpu:8`, `gpu:h100:8(S:0-1)`, `gpu:a100:4,mps:400`, `gres/gpu:2`,
    `(null)` -> (0, None)."""
    count, kind = 0, None
    for item in _split_top(gres or "", ","):
        item = item.split("(", 1)[0].strip()
        if item.startswith("gres/"):
            item = item[5:]
        parts = item.split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) >= 2 and parts[-1].isdigit():
            count += int(parts[-1])
            if len(parts) >= 3:
                kind = kind or parts[1]
        elif len(parts) == 1 or not parts[-1].isdigit():
            count += 1
            kind = kind or (parts[1] if len(parts) > 1 else None)
    return count, kind


# -- sinfo: the nodes ---------------------------------------------------------------------------------------------
NODE_FLAGS = {"*": "not responding", "~": "powered off (power saving)", "#": "powering up or being configured",
              "!": "pending power down", "%": "powering down", "$": "in a maintenance reservation",
              "@": "pending reboot", "^": "reboot issued", "-": "planned for a higher-priority job"}
_COMPACT = {"alloc": "allocated", "mix": "mixed", "drng": "draining", "drain": "drained", "comp": "completing",
            "resv": "reserved", "plnd": "planned", "npc": "perfctrs", "pow_dn": "powered_down", "pow_up": "powering_up",
            "unk": "unknown", "fail": "fail", "failg": "failing", "maint": "maint", "boot": "rebooting"}
_DRAINED = {"drained", "draining", "drain"}
_DOWN = {"down", "fail", "failing", "inval", "unknown", "future", "powered_down", "no_respond", "not_responding"}


@dataclass
class SinfoNode:
    name: str
    partition: str
    state: str  # Slurm's base state, long form: idle, mixed, allocated, drained, draining, down, ...
    flags: tuple = ()  # flag characters (*, ~, #, ...) and the +WORDS of a compound state (drain, not_responding)
    raw_state: str = ""
    gres: str = ""
    gpus: int = 0
    gpu_type: Optional[str] = None
    cpus: Optional[int] = None
    memory_mb: Optional[int] = None
    reason: Optional[str] = None
    reason_user: Optional[str] = None
    reason_time: Optional[str] = None
    default_partition: bool = False

    @property
    def drained(self) -> bool:
        return self.state in _DRAINED or "drain" in self.flags

    @property
    def down(self) -> bool:
        return self.state in _DOWN or "*" in self.flags or "not_responding" in self.flags or "fail" in self.flags

    @property
    def usable(self) -> bool:
        """Takes jobs: not drained, down, failing, unresponsive or held for a maintenance reservation (a powered-off
        node powers up on demand)."""
        return not (self.drained or self.down or "$" in self.flags or
                    self.state in ("maint", "reserved", "perfctrs", "rebooting"))

    def words(self) -> str:
        """`drained (not responding): Kill task failed, set by root at 2024-01-25T15:12:23`."""
        flags = [NODE_FLAGS.get(f, f.replace("_", " ")) for f in self.flags if f != "drain" or self.state not in
                 _DRAINED]
        text = self.state + (f" ({', '.join(flags)})" if flags else "")
        if self.reason:
            who = " by " + self.reason_user if self.reason_user else ""
            when = " at " + self.reason_time if self.reason_time else ""
            text += f": {self.reason}" + (f", set{who}{when}" if who or when else "")
        return text


def parse_node_state(text: str) -> tuple[str, tuple]:
    """(base state, flags) of sinfo's `%T`/`%t` or scontrol's `State=`: `drained*`, `idle~`, `mix-`, `IDLE+DRAIN`,
    `DOWN+NOT_RESPONDING`, `drng@`."""
    text = (text or "").strip().lower()
    flags: list[str] = []
    while text and text[-1] in NODE_FLAGS:
        flags.insert(0, text[-1])
        text = text[:-1]
    base, *extra = text.split("+")
    base = _COMPACT.get(base, base)
    if base == "idle" and "drain" in extra:
        base = "drained"
    elif base in ("allocated", "mixed", "completing") and "drain" in extra:
        base = "draining"
    return base, tuple(flags) + tuple(extra)


def parse_sinfo(text: str, fields: tuple = SINFO_FIELDS) -> list[SinfoNode]:
    """`sinfo --noheader --Node --format=SINFO_FORMAT` -> a SinfoNode per line (a node in two partitions: two).
    `fields` names the columns of another format (`%N|%T|%G|%c|%m|%E`: node, state, gres, cpus, memory_mb, reason)."""
    nodes = []
    for line in (text or "").splitlines():
        v = split_fields(line, fields) if line.strip() else None
        if v is None or not v.get("node"):
            continue
        state, flags = parse_node_state(v.get("state", ""))
        gpus, kind = gres_gpus(v.get("gres"))
        partition = v.get("partition", "")
        reason = v.get("reason", "")
        nodes.append(SinfoNode(
            name=v["node"], partition=partition.rstrip("*"), state=state, flags=flags, raw_state=v.get("state", ""),
            gres=v.get("gres", ""), gpus=gpus, gpu_type=kind, cpus=_int(v.get("cpus")),
            memory_mb=_int(v.get("memory_mb")), reason=None if reason in ("", "none", "(null)") else reason,
            reason_user=_user(v.get("reason_user")), reason_time=_time(v.get("reason_time")),
            default_partition=partition.endswith("*")))
    return nodes


def parse_sinfo_json(text) -> list[SinfoNode]:
    """`sinfo --json`'s nodes: a SinfoNode per node and partition. Slurm 22.05 gives `state` a word and
    `state_flags` a list ("idle", ["DRAIN"]); 23.02 on give `state` the list (["IDLE", "DRAIN"])."""
    doc = json.loads(text) if isinstance(text, str) else text
    out = []
    for n in doc.get("nodes") or []:
        st = n.get("state")
        words = [str(x) for x in st] if isinstance(st, list) else [str(st or "")] + list(n.get("state_flags") or [])
        state, flags = parse_node_state("+".join(w for w in words if w))
        gpus, kind = gres_gpus(n.get("gres"))
        changed = _jnum(n.get("reason_changed_at"))
        for part in n.get("partitions") or [""]:
            out.append(SinfoNode(
                name=n.get("name", ""), partition=part, state=state, flags=flags, raw_state="+".join(words),
                gres=n.get("gres") or "", gpus=gpus, gpu_type=kind, cpus=_jnum(n.get("cpus")),
                memory_mb=_jnum(n.get("real_memory")), reason=n.get("reason") or None,
                reason_user=_user(n.get("reason_set_by_user")),
                reason_time=epoch_text(changed) if changed else None))
    return out


def node_from_scontrol(rec: dict) -> SinfoNode:
    """A node of `scontrol --oneliner show node` (parse_scontrol's record): `State=IDLE+DRAIN`,
    `Reason=gpu xid 79 on GPU 2 [root@2026-12-06T23:04:07]`."""
    state, flags = parse_node_state(rec.get("State", ""))
    gpus, kind = gres_gpus(rec.get("Gres"))
    reason, user, when = rec.get("Reason") or None, None, None
    m = re.match(r"^(.*?)\s*\[([^@\]]+)@([^\]]+)\]$", reason or "")
    if m:
        reason, user, when = m.group(1), m.group(2), m.group(3)
    return SinfoNode(name=rec.get("NodeName", ""), partition=(rec.get("Partitions") or "").split(",")[0],
                     state=state, flags=flags, raw_state=rec.get("State", ""), gres=rec.get("Gres") or "",
                     gpus=gpus, gpu_type=kind, cpus=_int(rec.get("CPUTot")), memory_mb=_int(rec.get("RealMemory")),
                     reason=reason, reason_user=user, reason_time=when)




def parse_sinfo_reasons(text: str) -> dict[str, dict]:
    """`sinfo -R` as printed by default (`REASON USER TIMESTAMP NODELIST`, the reason cut at 20 characters) ->
    {node: {"reason", "user", "time"}}; the nodes of a line's host list each get it."""
    out = {}
    rx = re.compile(r"^(?P<reason>.*?)\s+(?P<user>\S+)\s+(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d|Unknown)\s+"
                    r"(?P<nodes>\S+)\s*$")
    for line in (text or "").splitlines():
        m = rx.match(line.rstrip())
        if not m or m.group("reason").strip() == "REASON":
            continue
        for node in expand_hostlist(m.group("nodes")):
            out[node] = {"reason": m.group("reason").strip(), "user": m.group("user"), "time": _time(m.group("time"))}
    return out


def failed_nodes(ending: SlurmEnding, nodes: Iterable[SinfoNode]) -> list[SinfoNode]:
    """The nodes the job ran on that Slurm now holds down, drained or unresponsive: on a NODE_FAIL, the node that
    failed it (sacct does not say which one); each with Slurm's reason."""
    mine = set(ending.nodes) | {n for a in ending.attempts for n in expand_hostlist(a.get("node_list"))}
    seen, out = set(), []
    for n in nodes:
        if n.name in mine and (n.down or n.drained) and n.name not in seen:
            seen.add(n.name)
            out.append(n)
    return out

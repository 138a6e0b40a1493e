"""slurm/nodes.py on recorded outputs (tests/data/slurm/; 22.05/ recorded on the local cluster): sinfo in its forms,
scontrol's nodes, a drained or down node with Slurm's reason, the node that failed a job."""
from __future__ import annotations

import json

import pytest

from gpuops.slurm import nodes, states

from support import DATA

SLURM = DATA / "slurm"


def recorded(name: str) -> str:
    """A recorded output without its `## ` header (where its shape comes from)."""
    return "\n".join(ln for ln in (SLURM / name).read_text().splitlines() if not ln.startswith("## "))


def by_id(jobs):
    return {j.job_id: j for j in jobs}


def test_gres_gpus():
    assert nodes.gres_gpus("gpu:h100:8(S:0-1)") == (8, "h100")
    assert nodes.gres_gpus("gpu:a100:4,mps:400") == (4, "a100")
    assert nodes.gres_gpus("gpu:8") == (8, None)
    assert nodes.gres_gpus("(null)") == (0, None)
    assert nodes.sinfo_argv("gpu") == ["sinfo", "--noheader", "--Node", "--format=%N|%P|%T|%G|%c|%m|%u|%H|%E",
                                       "--partition=gpu"]
    assert len(nodes.SINFO_FORMAT.split("|")) == len(nodes.SINFO_FIELDS)


# -- nodes ----------------------------------------------------------------------------------------------------------
def test_sinfo_nodes_their_states_flags_gres_and_reasons():
    got = nodes.parse_sinfo(recorded("23.11/sinfo.txt"))
    gpu = {n.name: n for n in got if n.partition == "gpu"}
    assert [n.partition for n in got if n.name == "gpu01"] == ["gpu", "long"]  # a node in two partitions
    assert gpu["gpu01"].default_partition and gpu["gpu01"].gpus == 8 and gpu["gpu01"].gpu_type == "h100"
    assert gpu["gpu03"].drained and not gpu["gpu03"].usable
    assert gpu["gpu03"].words() == "drained: Kill task failed, set by root at 2024-01-25T15:12:23"
    assert gpu["gpu04"].state == "down" and gpu["gpu04"].flags == ("*",) and gpu["gpu04"].down
    assert gpu["gpu04"].words().startswith("down (not responding): Not responding")
    assert gpu["gpu06"].state == "draining" and "@" in gpu["gpu06"].flags and not gpu["gpu06"].usable
    assert gpu["gpu07"].usable and "powered off" in gpu["gpu07"].words()  # powers up on demand
    assert not gpu["gpu08"].usable  # held for a maintenance reservation ($)
    assert [n.name for n in got if n.usable and n.partition == "gpu"] == ["gpu01", "gpu02", "gpu05", "gpu07"]
    cpu = next(n for n in got if n.name == "cpu01")
    assert cpu.gpus == 0 and cpu.reason is None and cpu.reason_user is None


@pytest.mark.parametrize("text,state,flags", [
    ("IDLE+DRAIN", "drained", ("drain",)), ("MIXED+DRAIN", "draining", ("drain",)),
    ("DOWN+NOT_RESPONDING", "down", ("not_responding",)), ("drng@", "draining", ("@",)), ("idle~", "idle", ("~",)),
    ("mix-", "mixed", ("-",)), ("alloc", "allocated", ()), ("mixed*", "mixed", ("*",))])
def test_node_states_long_compact_and_compound(text, state, flags):
    assert nodes.parse_node_state(text) == (state, flags)


def test_sinfo_reasons_default_output_names_every_node_of_a_line():
    got = nodes.parse_sinfo_reasons(recorded("23.11/sinfo-R.txt"))
    assert sorted(got) == ["gpu03", "gpu04", "gpu06", "gpu09", "gpu10"]
    assert got["gpu03"] == {"reason": "Kill task failed", "user": "root", "time": "2024-01-25T15:12:23"}


def test_the_local_cluster_22_05_nodes_in_every_form_it_was_recorded():
    """22.05/ is recorded on the local cluster (sandbox/slurm.py): a drained node with the reason an admin set."""
    plain = nodes.parse_sinfo(recorded("22.05/sinfo_nodes_drained.txt"),
                              fields=("node", "state", "gres", "cpus", "memory_mb", "reason"))
    drained = [n for n in plain if n.drained]
    assert [n.name for n in drained] == ["n3"] and drained[0].reason == "gpu xid 79 on GPU 2"
    assert all(n.gpus == 8 for n in plain) and [n.name for n in plain if n.usable] == ["n1", "n2", "n4"]
    js = nodes.parse_sinfo_json(recorded("22.05/sinfo_json_drained.txt"))  # 22.05: state + state_flags
    n3 = next(n for n in js if n.name == "n3")
    assert n3.drained and n3.reason == "gpu xid 79 on GPU 2" and n3.reason_user == "root"
    assert n3.reason_time.endswith(" UTC")
    sc = [nodes.node_from_scontrol(r) for r in states.parse_scontrol(recorded("22.05/scontrol_nodes_drained.txt"))]
    n3 = next(n for n in sc if n.name == "n3")
    assert n3.drained and n3.reason == "gpu xid 79 on GPU 2" and n3.reason_user == "root" and n3.gpus == 8
    down = nodes.parse_sinfo(recorded("22.05/sinfo_nodes_node_down.txt"),
                             fields=("node", "state", "gres", "cpus", "memory_mb", "reason"))
    assert [(n.name, n.down, n.reason) for n in down if not n.usable] == [("n2", True, "Not responding")]
    parsable = nodes.parse_sinfo(recorded("22.05/sinfo_R_parsable_node_down.txt"),
                                 fields=("node", "state", "reason", "reason_user", "reason_time"))
    assert [(n.name, n.down, n.reason, n.reason_user) for n in parsable] == [("n2", True, "Not responding",
                                                                            "root(0)")]


def test_a_reason_holding_the_delimiter_stays_whole():
    (n,) = nodes.parse_sinfo("gpu03|gpu*|drained|gpu:8|64|1000|root|2024-01-25T15:12:23|PSU 2 | fan failed")
    assert n.reason == "PSU 2 | fan failed"


def test_sinfo_json_of_23_11_on_gives_state_a_list():
    doc = {"nodes": [{"name": "gpu09", "state": ["IDLE", "DRAIN"], "partitions": ["gpu", "long"],
                      "gres": "gpu:h100:8(S:0-1)", "reason": "bad IB cable", "reason_set_by_user": "root",
                      "reason_changed_at": {"set": True, "infinite": False, "number": 1746619948},
                      "cpus": 224, "real_memory": 2000000}]}
    got = nodes.parse_sinfo_json(json.dumps(doc))
    assert [(n.partition, n.state, n.drained, n.gpus) for n in got] == [("gpu", "drained", True, 8),
                                                                        ("long", "drained", True, 8)]
    assert got[0].reason_time == "2025-05-07T12:12:28 UTC"


def test_the_node_that_failed_a_job_is_named_with_slurms_reason():
    ending = states.ending_from_sacct(recorded("23.11/sacct-gpu.txt"), "4402")
    failed = nodes.failed_nodes(ending, nodes.parse_sinfo(recorded("23.11/sinfo.txt")))
    assert [(n.name, n.reason) for n in failed] == [("gpu03", "Kill task failed"), ("gpu04", "Not responding")]

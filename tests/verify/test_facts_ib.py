"""verify/facts_ib.py on recorded outputs of real tools (tests/data/ib/, each file's header says where its shape comes
from): ibstat, ibv_devinfo -v, the probe's sysfs fact, lsmod, NCCL's lists in its own syntax, NCCL_DEBUG=INFO lines
and nccl-tests' all_reduce_perf table; and the probe's gathering itself, run here."""
from __future__ import annotations

import json

import pytest

from gpuops.remote import probe
from gpuops.verify import facts_ib as F

from support import DATA

IB = DATA / "ib"


def recorded(name: str) -> str:
    return "\n".join(ln for ln in (IB / name).read_text().splitlines() if not ln.startswith("## "))


def test_ibstat_of_an_h100_node_eight_ndr_rails_and_an_ethernet_pair():
    ports = F.parse_ibstat(recorded("ibstat-h100-ndr.txt"))
    ib = [p for p in ports if p.infiniband]
    assert [p.name for p in ib] == [f"mlx5_{i}:1" for i in range(8)]
    assert all(p.active and p.rate_gbps == 400 and p.phys_state == "LinkUp" for p in ib)
    eth = {p.device: p for p in ports if not p.infiniband}
    assert eth["mlx5_8"].active and eth["mlx5_8"].link_layer == "Ethernet"
    assert (eth["mlx5_9"].state, eth["mlx5_9"].phys_state) == ("DOWN", "Disabled")


def test_ibstat_of_a_degraded_node():
    ports = {p.device: p for p in F.parse_ibstat(recorded("ibstat-degraded.txt"))}
    assert (ports["mlx5_3"].state, ports["mlx5_3"].phys_state) == ("DOWN", "Polling")
    assert ports["mlx5_5"].active and ports["mlx5_5"].rate_gbps == 200


def test_ibv_devinfo_rate_from_width_and_speed():
    a, b = F.parse_ibv_devinfo(recorded("ibv_devinfo-v.txt"))
    assert (a.name, a.state, a.phys_state, a.rate_gbps, a.infiniband) == ("mlx5_0:1", "ACTIVE", "LinkUp", 400.0, True)
    assert (b.state, b.phys_state) == ("DOWN", "Polling")


@pytest.mark.parametrize("text,gbps", [("400 Gb/sec (4X NDR)", 400.0), ("200", 200.0), ("100.0 Gbps (128)", 100.0),
                                       ("56", 56.0), ("", None)])
def test_rates(text, gbps):
    assert F.parse_rate(text) == gbps


def test_the_probes_fact_sysfs_modules_interfaces_and_ncclS_variables():
    ib = F.from_probe(json.loads((IB / "probe-ib-h100.json").read_text()))
    assert ib.source == "sysfs" and len(ib.ib_ports) == 8 and all(p.rate_gbps == 400 for p in ib.ib_ports)
    assert ib.ib_ports[0].state == "ACTIVE" and ib.ib_ports[0].phys_state == "LinkUp"
    assert ib.peermem is True and "ibp26s0" in ib.netdevs
    # /etc/nccl.conf's NCCL_IB_HCA=mlx5 is overridden by the environment's, its NCCL_DEBUG kept (as NCCL does)
    assert ib.env["NCCL_IB_HCA"].startswith("=mlx5_0,") and ib.env["NCCL_DEBUG"] == "WARN"
    none = F.from_probe(json.loads((IB / "probe-ib-none.json").read_text()))
    assert not none.present and none.peermem is False and none.error is None
    assert F.from_probe({}).error == "not gathered"
    assert F.from_probe({"ib": {"ok": False, "error": "timed out after 5s"}}).error == "timed out after 5s"


def test_lsmod_and_proc_modules():
    mods = F.parse_modules(recorded("lsmod.txt"))
    assert "mlx5_ib" in mods and "Module" not in mods and not set(F.PEERMEM_MODULES) & mods
    assert F.parse_modules("nvidia_peermem 16384 0 - Live 0x0000000000000000\n") == {"nvidia_peermem"}


def test_nccl_lists_in_ncclS_own_syntax():
    hca = F.parse_nccl_list("mlx5")
    assert hca.selects("mlx5_0") and hca.selects("mlx5_11") and not hca.selects("ibp26s0")
    exact = F.parse_nccl_list("=mlx5_0:1,mlx5_1:1")
    assert exact.exact and exact.selects("mlx5_0", 1) and not exact.selects("mlx5_0", 2)
    assert not exact.selects("mlx5_10", 1)  # exact: mlx5_1 is not a prefix of mlx5_10
    ex = F.parse_nccl_list("^=mlx5_1,mlx5_4")
    assert ex.exclude and ex.exact and not ex.selects("mlx5_1") and ex.selects("mlx5_2")
    assert F.parse_nccl_list("^docker,lo").selects("eth0") and not F.parse_nccl_list("^docker,lo").selects("docker0")
    assert F.parse_nccl_list("mlx5_9,mlx5_0").unmatched(["mlx5_0", "mlx5_1"]) == ["mlx5_9"]
    assert F.parse_nccl_list("") is None and F.parse_nccl_list(None) is None
    assert F.parse_nccl_conf("# x\nNCCL_IB_HCA=mlx5 # ours\nOTHER=1\n") == {"NCCL_IB_HCA": "mlx5"}


def test_nccl_chose_infiniband_with_gpudirect():
    n = F.parse_nccl_log(recorded("nccl-ib-gdr.log"))
    assert (n.transport, n.gdr, n.network, n.version) == ("IB", True, "IB", "2.21.5")
    assert [d for d, _, _ in n.ib_devices] == [f"mlx5_{i}" for i in range(8)] and n.hosts == {"gpu01", "gpu02"}
    assert n.gdr_enabled == ["mlx5_0"] and n.net_connections == 6 and n.via["P2P/IPC/read"] == 2


def test_nccl_fell_back_to_sockets():
    n = F.parse_nccl_log(recorded("nccl-socket-fallback.log"))
    assert (n.transport, n.gdr, n.network, n.no_ib_device) == ("Socket", False, "Socket", True)
    assert n.socket_ifaces == ["ibp12s0", "eth0"] and n.hosts == {"gpu01", "gpu02"}  # srun's and torchrun's prefixes
    assert n.via["NET/Socket"] == 4


def test_nccl_on_ib_without_gpudirect_and_through_a_plugin():
    n = F.parse_nccl_log(recorded("nccl-ib-no-gdr.log"))
    assert (n.transport, n.gdr) == ("IB", False)
    assert n.gdr_disabled == [("mlx5_0", "no module"), ("mlx5_1", "no module")]
    p = F.parse_nccl_log(recorded("nccl-ibext-plugin.log"))
    assert (p.transport, p.gdr, p.network) == ("IB", True, "IBext_v8")
    one = F.parse_nccl_log("h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read\n")
    assert one.transport is None and one.net_connections == 0


def test_all_reduce_perf_tables_old_and_new():
    ib = F.parse_all_reduce(recorded("all_reduce_perf-2x8-h100-ib.txt"))
    assert (len(ib.rows), ib.ranks, ib.hosts, ib.avg_busbw, ib.wrong) == (14, 16, ["gpu01", "gpu02"], 251.33, 0)
    assert ib.gpus[0] == "NVIDIA H100 80GB HBM3" and ib.largest == 8 << 30
    assert ib.rows[0]["root"] == "-1" and ib.rows[0]["oop"]["busbw"] == 46.18 and ib.rows[0]["ip"]["busbw"] == 46.75
    assert ib.peak_busbw(1 << 30) == pytest.approx(431.57) and ib.peak_busbw() == ib.peak_busbw(1 << 30)
    old = F.parse_all_reduce(recorded("all_reduce_perf-1x8-a100-old.txt"))
    assert old.ranks == 8 and old.hosts == ["AI-A100-01"] and "redop" in old.rows[0] and "root" not in old.rows[0]
    assert old.wrong == 2 and old.peak_busbw(1 << 30) == pytest.approx(235.44)
    bare = F.parse_all_reduce("65536 8192 float 16.57 1.98 1.98 0e+00 13.83 2.37 2.37 0e+00\n")  # NCCL 2.6, no op
    assert bare.rows[0]["oop"]["busbw"] == 1.98 and bare.rows[0]["ip"]["time"] == 13.83


def test_the_probe_gathers_the_ib_fact_cheaply_where_there_is_no_infiniband(tmp_path, monkeypatch):
    """The probe's own function, run here (no /sys/class/infiniband on a test machine): a few small reads."""
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=eth0")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    got = probe.ib_facts({"NCCL_IB_DISABLE": None, "NCCL_DEBUG": "INFO"})
    assert got["env"] == {"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_DEBUG": "INFO"}  # the job's own: unset, added
    assert "sysfs" in got and isinstance(got["peermem_paths"], list)
    facts = {}
    probe.timed("ib", lambda: probe.ib_facts(), 5, facts)
    assert facts["ib"]["ok"] and facts["ib"]["seconds"] < 1
    ib = F.from_probe(facts)
    assert ib.error is None and (ib.present == bool(got["sysfs"]))


def test_the_probe_reads_sysfs_as_the_kernel_writes_it(tmp_path, monkeypatch):
    root = tmp_path / "infiniband"
    for dev, state, rate in (("mlx5_0", "4: ACTIVE", "400 Gb/sec (4X NDR)"), ("mlx5_1", "1: DOWN", "10 Gb/sec (4X SDR)")):
        d = root / dev / "ports" / "1"
        d.mkdir(parents=True)
        for name, value in (("state", state), ("phys_state", "5: LinkUp" if "ACTIVE" in state else "2: Polling"),
                            ("rate", rate), ("link_layer", "InfiniBand")):
            (d / name).write_text(value + "\n")
    monkeypatch.setattr(probe, "IB_SYSFS", str(root))
    ports = {p.device: p for p in F.ports_from_sysfs(probe.ib_facts()["sysfs"])}
    assert (ports["mlx5_0"].state, ports["mlx5_0"].rate_gbps) == ("ACTIVE", 400.0)
    assert (ports["mlx5_1"].state, ports["mlx5_1"].phys_state) == ("DOWN", "Polling")

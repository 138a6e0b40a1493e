"""gpuops/hostpool.py: a per-host operation over many hosts, in a bounded pool, a result per host; the worst exit
code decides."""
from __future__ import annotations

from gpuops import hostpool
from gpuops.errors import ConnectError
from gpuops.profiles.model import Profile


def prof(**kw):
    return Profile.model_validate({"name": "f", **kw})


def test_worst_code_orders_interrupt_connection_usage_failure_ok():
    assert hostpool.worst_code([0, 1, 0]) == 1
    assert hostpool.worst_code([1, 3, 2]) == 3
    assert hostpool.worst_code([2, 1]) == 2
    assert hostpool.worst_code([130, 3]) == 130
    assert hostpool.worst_code([]) == 0


def test_for_each_runs_in_parallel_keeps_rank_order_and_captures_errors():
    import threading
    import time

    p = prof(hosts=["a", "b", "c", "d"])
    seen = set()

    def fn(node):
        seen.add(threading.get_ident())
        time.sleep(0.2)
        if node.host == "c":
            raise ConnectError("refused")
        if node.host == "d":
            raise ValueError("odd")
        return node.host

    t0 = time.monotonic()
    res = hostpool.for_each(p.nodes(), fn, parallel=4)
    assert time.monotonic() - t0 < 0.6 and len(seen) == 4
    assert [r.value for r in res] == ["a", "b", None, None]
    assert [r.code for r in res] == [0, 0, 3, 1]
    assert res[2].message == "refused" and "odd" in res[3].message
    assert hostpool.worst_code(r.code for r in res) == 3

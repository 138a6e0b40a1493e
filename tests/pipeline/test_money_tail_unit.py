"""--max-cost's tail (pipeline/money.tail_s): the seconds a run bills after it decides to stop, from what the run
measured. Fresh-clone CI runs on a loaded 2-core machine went over a $0.03 cap twice when the estimate was tight:
a final fetch of 4.9 s against 1.2 s left for it, then 5.8 s after a 0.4 s sync with no fetch measured before (the
same fetch takes 1.4 s on the quiet machine)."""
from __future__ import annotations

from gpuops.pipeline.money import FETCH_FLOOR_S, ROUND_S, TERMINATE_S, tail_s


def test_the_tail_leaves_room_for_the_fetch_seen_on_a_loaded_machine():
    # the second overrun: a 0.4 s sync (the round), one --fetch name, no fetch measured while it ran, a 1 s
    # termination: the stop's fetch took 5.8 s, and the sample, the job's stop and the log came on top
    assert tail_s(0.4, 1, None, 2.0, 1.0) >= 2.0 + 0.4 + 5.8 + 1.0
    # the first: a 0.3 s round: 4.9 s of fetch
    assert tail_s(0.3, 1, None, 2.0, 1.0) >= 2.0 + 0.3 + 4.9 + 1.0


def test_each_name_and_the_unknowns_count():
    base = tail_s(0.5, 0, None, 2.0, 1.0)
    assert base == 2.0 + 0.5 + 1.0 + 1.0  # the sample, the job's stop, the log (two rounds), the termination
    assert tail_s(0.5, 2, None, 2.0, 1.0) == base + 2 * FETCH_FLOOR_S
    assert tail_s(2.0, 1, None, 2.0, 1.0) == 2.0 + 2.0 + 4.0 + 6 * 2.0 + 1.0  # six rounds on a slow link
    assert tail_s(0.5, 1, 4.0, 2.0, 1.0) == base + 8.0  # twice the last fetch, when that is more
    assert tail_s(None, 0, None, 2.0, None) == 2.0 + 3 * ROUND_S + TERMINATE_S  # nothing measured yet

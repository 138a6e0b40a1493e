"""The put ledger of a local --data folder (transfer/dataplan.py): which puts changed a run's data under it, and the
warnings naming them (review of issue 35: "warn every run whose data changed under it")."""
from __future__ import annotations

import json
from pathlib import Path

from gpuops.transfer import dataplan as dp


def _line(run, at, changed):
    return json.dumps(dp.put_line(run, at, "laptop", changed))


def test_the_puts_after_this_runs_own_by_other_runs_that_changed_files():
    entries = dp.parse_puts([_line("A", 1, ["x"]), "not json", _line("B", 2, []), _line("C", 3, ["t.txt"]),
                             _line("A", 4, []), _line("D", 5, [f"f{i}" for i in range(30)])])
    later = dp.changed_under(entries, "A")  # after A's last put: D (B changed nothing, C came before A's re-put)
    assert [e["run"] for e in later] == ["D"] and later[0]["count"] == 30 and len(later[0]["changed"]) == 20
    assert dp.changed_under(entries, "Z") == []  # never put here: nothing to say
    w = dp.changed_under_warning("./corpus", "/fs/gpuops/data/corpus-k", later)
    assert w.startswith("the data changed under this run: /fs/gpuops/data/corpus-k (--data ./corpus) was put again")
    assert "run D at " in w and "changed 30 files (f0, f1" in w and "and 10 more)" in w
    assert dp.changed_under_warning("./corpus", "/d", []) is None


def test_a_put_that_changed_files_names_the_put_before(tmp_path):
    (tmp_path / "corpus").mkdir()
    src = dp.parse("corpus", tmp_path)
    prev = dp.parse_puts([_line("A", 1_700_000_000, ["a"])])[-1]
    msg, hint = dp.changed_since_warning(src, "/d/corpus-k", ["train.txt"], prev, "B")
    assert msg.startswith("data corpus: 1 file changed since the last put into /d/corpus-k (run A, ")
    assert msg.endswith("from laptop): train.txt") and "change under it" in hint
    assert "(this run, " in dp.changed_since_warning(src, "/d", ["x"], prev, "A")[0]  # a replacement's re-put
    assert dp.changed_since_warning(src, "/d", [], prev, "B") is None  # nothing changed
    assert dp.changed_since_warning(src, "/d", ["x"], None, "B") is None  # the first put
    assert dp.puts_file("/d/corpus-k/") == "/d/corpus-k.puts" and not Path(dp.puts_file("/d/x")).is_relative_to("/d/x")

"""Where a run's checkpoints live and which count (pipeline/checkpoints.py, issue #27): one decision, pure."""
from __future__ import annotations

from gpuops.pipeline import checkpoints as ck
from gpuops.transfer import plan as tr


def listing(*rows):
    return [list(r) for r in rows], tr.step_dirs(rows)


def test_each_run_has_its_own_local_folder_and_sync_never_uploads_a_fetched_one(tmp_path):
    a, b = ck.home("train-1-aaaa", ["checkpoints"]), ck.home("train-1-bbbb", ["checkpoints"])
    assert a.local == "runs/train-1-aaaa/checkpoints" and b.local != a.local  # two runs never share one
    assert ck.fetch_dest("train-1-aaaa", "outputs", tmp_path) == tmp_path / "runs/train-1-aaaa/outputs"
    assert ck.home("r", []) is None
    assert ck.home("r", ["ckpt"], {"ckpt": "out/ckpt"}).remote == "out/ckpt"
    assert ck.sync_excludes(["ckpt", "outputs", "abs"], {"ckpt": "./out/ckpt/", "abs": "/lambda/nfs/x"}) == \
        ["/out/ckpt", "/outputs"]


def test_a_step_folder_from_before_the_job_never_counts():
    files, steps = listing(("global_step_99/model.bin", 10, 100.0), ("global_step_99/optim.pt", 10, 100.0),
                           ("global_step_1/model.bin", 10, 500.0), ("global_step_1/optim.pt", 10, 500.0),
                           ("global_step_2/model.bin", 10, 520.0), ("global_step_2/optim.pt", 10, 521.0))
    v = ck.resumable(steps, files=files, since=400.0, job="alive", quiet=True)
    assert v.dir == "global_step_2" and "global_step_99: written before the job started" in v.reasons()
    assert ck.resumable(steps, files=files, since=None, job="alive", quiet=True).dir == "global_step_99"


def test_a_first_checkpoint_with_no_marker_counts_only_once_the_job_moved_past_it():
    """Issue 35: the model written, the optimizer still gathered for longer than two samples (nothing open, the
    listing still): held still is not complete. Before: rule (d) counted it, then resumed from it."""
    files, steps = listing(("checkpoint-1/model.bin", 10, 500.0))  # model written, optimizer not yet
    v = ck.resumable(steps, files=files, since=400.0, job="died", quiet=True)
    assert v.dir is None and "counts once the job has moved past it" in v.reasons()
    assert ck.resumable(steps, files=files, since=400.0, job="alive", quiet=False).dir is None  # still changing
    assert ck.resumable(steps, files=files, since=400.0, job="alive", quiet=True).dir is None  # held still: not enough
    assert ck.resumable(steps, files=files, since=400.0, job="succeeded", quiet=False).evidence == ["succeeded"]
    files, steps = listing(("checkpoint-1/model.bin", 10, 500.0), ("checkpoint-1/COMPLETE", 0, 501.0))
    v = ck.resumable(steps, files=files, since=400.0, job="died", quiet=False)
    assert v.dir == "checkpoint-1" and v.evidence == ["marker:gpuops"]


def test_a_successor_completes_its_predecessor_and_a_short_newest_is_passed_over():
    files, steps = listing(("checkpoint-1/model.bin", 10, 500.0), ("checkpoint-1/optim.pt", 10, 501.0),
                           ("checkpoint-2/model.bin", 10, 510.0))
    v = ck.resumable(steps, files=files, since=400.0, job="died", quiet=False)
    assert v.dir == "checkpoint-1" and v.step == 1 and "checkpoint-2: lacks files" in v.reasons()
    assert v.evidence == ["successor"]
    files, steps = listing(("checkpoint-1/model.bin", 10, 500.0), ("checkpoint-2/model.bin", 10, 510.0),
                           ("checkpoint-2/optim.pt", 10, 511.0))
    assert ck.resumable(steps, files=files, since=400.0, job="died", quiet=False).dir is None  # 1 lacks optim.pt
    assert ck.resumable(steps, files=files, since=400.0, job="succeeded", quiet=False).dir == "checkpoint-2"


def test_a_folder_without_step_folders_is_one_checkpoint():
    files, steps = listing(("model.bin", 10, 500.0))
    assert ck.resumable(steps, files=files, since=400.0, job="alive", quiet=True).dir == ""
    assert ck.resumable(steps, files=files, since=600.0, job="alive", quiet=True).dir is None
    assert ck.resumable(steps, files=files, since=400.0, job="died", quiet=True).dir is None


def test_on_a_filesystem_the_checkpoint_folder_is_the_runs_own_there():
    h = ck.home("r-1", [], None, "/lambda/nfs/work")
    assert (h.name, h.filesystem) == ("checkpoints", "/lambda/nfs/work/gpuops/runs/r-1/checkpoints")
    assert ck.home("r-1", ["ckpt"], {"ckpt": "/abs/ckpt"}, "/lambda/nfs/work").filesystem is None  # outside the project
    assert ck.names([], "/lambda/nfs/work") == ["checkpoints"] and ck.names(["out"], None) == ["out"]
    e = ck.entry("checkpoints", "checkpoints", "checkpoint-3", 3, 1.0, "r-1", h.filesystem)
    assert e["local"] is None and ck.where(e) == h.filesystem + "/checkpoint-3"
    assert e["path"] == "checkpoints/checkpoint-3"
    assert "gpuops up ckpt --fs work" in ck.get_later(h, "work", "gpu_1x_h100_pcie")


def test_the_link_and_its_listing_on_a_real_shell(tmp_path):
    import subprocess

    fs = tmp_path / "fs" / "gpuops" / "runs" / "r-1" / "checkpoints"
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "checkpoints").mkdir()  # an empty folder of that name is replaced by the link
    r = subprocess.run(["sh", "-c", ck.link_command(str(tmp_path / "proj"), "checkpoints", str(fs))],
                       capture_output=True, text=True)
    assert r.returncode == 0 and (tmp_path / "proj" / "checkpoints").resolve() == fs.resolve()
    (fs / "checkpoint-1").mkdir()
    (fs / "checkpoint-1" / "model.bin").write_bytes(b"x" * 5)
    r = subprocess.run(["sh", "-c", ck.link_command(str(tmp_path / "proj"), "checkpoints", str(fs))],
                       capture_output=True, text=True)
    rows = ck.parse_listing(r.stdout)
    assert r.returncode == 0 and [(x[0], x[1]) for x in rows] == [("checkpoint-1/model.bin", 5)]
    (tmp_path / "proj2" / "checkpoints").mkdir(parents=True)
    (tmp_path / "proj2" / "checkpoints" / "mine").write_text("x")  # a folder of its own: refused, untouched
    r = subprocess.run(["sh", "-c", ck.link_command(str(tmp_path / "proj2"), "checkpoints", str(fs))])
    assert r.returncode == 3 and (tmp_path / "proj2" / "checkpoints" / "mine").read_text() == "x"


def test_on_a_filesystem_the_steps_after_the_resume_point_are_set_aside_never_deleted():
    _, steps = listing(("checkpoint-1/m", 1, 1.0), ("checkpoint-2/m", 1, 2.0), ("checkpoint-3/m", 1, 3.0))
    assert ck.set_aside(steps, 2) == ["checkpoint-3"] and ck.set_aside(steps, None) == sorted(steps)
    cmd = ck.set_aside_command("/fs/gpuops/runs/r/checkpoints", ["checkpoint-3"], "20261127-120000")
    assert "rm " not in cmd and "mv -- /fs/gpuops/runs/r/checkpoints/checkpoint-3 " \
                               "/fs/gpuops/runs/r/checkpoints.passed-over/checkpoint-3.20261127-120000" in cmd

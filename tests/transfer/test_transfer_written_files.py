"""Issue #36: a file the script only WRITES is no file the job needs sent. The docs' own rehearsal (train.py writes
checkpoints/step_1/model.bin; `gpuops fetch` brings it back) got, on its second `train`, "train.py names
checkpoints/step_1/model.bin, which sync leaves out ... to send it: gpuops never sends it": false twice over. A file
the script reads is still said, and its "how to send it" never contradicts itself."""
from __future__ import annotations

from pathlib import Path

from gpuops.transfer import preview as pv
from gpuops.transfer.plan import ORIGIN_FETCHED, ORIGIN_OWN, labelled_rules

REHEARSAL = ('import os\nos.makedirs("checkpoints/step_1", exist_ok=True)\n'
             'open("checkpoints/step_1/model.bin", "wb").write(os.urandom(4096))\nprint("step 1 loss 0.5")\n')


def _project(tmp: Path, script: str, files: list[str]) -> Path:
    (tmp / "train.py").write_text(script)
    for f in files:
        (tmp / f).parent.mkdir(parents=True, exist_ok=True)
        (tmp / f).write_bytes(b"x")
    return tmp


def test_a_file_the_script_only_writes_is_not_said(tmp_path):
    p = _project(tmp_path, REHEARSAL, ["checkpoints/step_1/model.bin"])
    for rules in (labelled_rules(["checkpoints"]), labelled_rules([], fetched=["checkpoints"])):
        assert pv.silent_exclusions(p, "train.py", rules) == []


def test_written_in_many_ways_is_not_said(tmp_path):
    script = ('import torch, json, numpy as np\n'
              'torch.save(model.state_dict(), "outputs/final.pt")\n'
              'model.save_pretrained("outputs/hf/model.safetensors")\n'
              'Path("outputs/metrics.json").write_text(json.dumps(m))\n'
              'np.save("outputs/emb.npy", x)\n'
              'with open("outputs/log.txt", mode="a") as f:\n    f.write("x")\n')
    files = ["outputs/final.pt", "outputs/hf/model.safetensors", "outputs/metrics.json", "outputs/emb.npy",
             "outputs/log.txt"]
    p = _project(tmp_path, script, files)
    assert pv.silent_exclusions(p, "train.py", labelled_rules(["outputs"])) == []
    (p / "job.sh").write_text("python train.py > outputs/run.log 2>&1\necho done | tee -a outputs/done.txt\n"
                              "curl -o outputs/data.bin https://example.com/x\n")
    _project(p, script, ["outputs/run.log", "outputs/done.txt", "outputs/data.bin"])
    assert pv.silent_exclusions(p, "job.sh", labelled_rules(["outputs"])) == []


def test_a_file_the_script_reads_is_still_said(tmp_path):
    script = REHEARSAL + 'state = torch.load("checkpoints/pretrained.pt")\nopen("checkpoints/step_1/model.bin").read()\n'
    p = _project(tmp_path, script, ["checkpoints/step_1/model.bin", "checkpoints/pretrained.pt"])
    got = {path for path, _, _ in pv.silent_exclusions(p, "train.py", labelled_rules(["checkpoints"]))}
    assert got == {"checkpoints/pretrained.pt", "checkpoints/step_1/model.bin"}  # read too, once: said


def test_how_to_send_never_contradicts_itself():
    for origin in (ORIGIN_FETCHED, ORIGIN_OWN):
        text = pv.exclusion_warning("train.py", "checkpoints/a.pt", "/checkpoints/", origin)
        how = text.split("to send it: ", 1)[1]
        assert not how.startswith("gpuops never sends it"), text
        assert "copy" in how or "move" in how, text
    text = pv.exclusion_warning("train.py", "checkpoints/a.pt", "/checkpoints/", ORIGIN_FETCHED)
    assert "gpuops fetch wrote" in text and "runs/fetched.json" in text, text


def test_the_rehearsal_trained_again_after_fetch_says_nothing_false(sandbox, gpuops, isolated):
    from support.runs import run_id_of, wait_ended

    (isolated / "train.py").write_text(REHEARSAL)
    r = gpuops("train", "--script", "train.py", "--no-snapshot")
    assert wait_ended(sandbox, run_id_of(r)) == 0
    r = gpuops("fetch")
    assert r.code == 0, r.all
    assert (isolated / "checkpoints" / "step_1" / "model.bin").is_file()
    r = gpuops("train", "--script", "train.py", "--no-snapshot")
    assert r.code == 0, r.all
    assert "which sync leaves out" not in r.err, r.err
    assert wait_ended(sandbox, run_id_of(r)) == 0

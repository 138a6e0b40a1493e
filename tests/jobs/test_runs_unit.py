"""The pure core of the run lifecycle: ids, environment layering, secrets, conflicts, state, parsers, scripts."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from gpuops.jobs import plan as core
from gpuops.jobs import watch as w
from gpuops.errors import UsageError
from gpuops.jobs import scripts as rl

PRESETS = {
    "presets": {"h100": {"env": {
        "NVIDIA_TF32_OVERRIDE": {"value": "1", "reason": "tf32"},
        "PYTORCH_CUDA_ALLOC_CONF": {"value": "expandable_segments:True", "reason": "frag"},
    }}},
    "conflicts": [{"id": "x", "when": {"env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
                                       "package": {"vllm": ">=0.8"}},
                   "message": "expandable segments vs vLLM V1", "remediation": "unset it"}],
}


def plan(**kw):
    args = dict(preset="h100", presets_doc=PRESETS, profile_env={}, cli_env={}, secret_names=[], local_env={},
                run_id="r-1", profile_name="lambda")
    args.update(kw)
    return core.plan_env(**args)


def test_run_id_uses_the_clock_and_avoids_collisions():
    clock = lambda: datetime(2025, 12, 5, 22, 7, 16)  # noqa: E731
    token = lambda: "beef"  # noqa: E731
    assert core.run_id(None, "scripts/train/run_h100.sh", clock=clock, token=token) == "run_h100-20251205-220716-beef"
    assert core.run_id("my run", "x.py", clock=clock, token=token) == "my_run-20251205-220716-beef"
    taken = ["x-20251205-220716-beef", "x-20251205-220716-beef-2"]
    assert core.run_id(None, "x.py", clock=clock, taken=taken, token=token) == "x-20251205-220716-beef-3"


def test_two_jobs_started_in_the_same_second_get_different_ids():
    """Issue #28: two runs of one project, each on its own instance, start their jobs in the same second; neither
    sees the other's id yet (nothing taken), yet the ids differ (the per-second id made them collide). The random
    part has 16 bits: two ids collide once in 65,536; fifty drawn at once share one about once in fifty draws (the
    birthday bound: CI met it), never five (a per-second id would give one id for all fifty)."""
    clock = lambda: datetime(2025, 12, 5, 22, 7, 16)  # noqa: E731
    ids = {core.run_id(None, "train.py", clock=clock) for _ in range(50)}
    assert len(ids) > 45 and all(i.startswith("train-20251205-220716-") for i in ids)


def test_two_pipeline_runs_in_the_same_second_never_share_an_id(tmp_path):
    from gpuops.pipeline import runner as rn
    from gpuops.pipeline import stages as pl

    def rec(token=lambda: "aaaa"):
        return rn.new_record(script="train.py", args=[], regions=[], nodes=1, fetch=[], keep=False, ttl_s=None,
                             max_cost=None, key=None, name="train", clock=lambda: 1_800_000_000.0, project=tmp_path,
                             token=token)

    first = rec()
    pl.save(first, tmp_path)
    drawn = iter(["aaaa", "aaaa", "bbbb"])
    second = rec(token=lambda: next(drawn))
    assert first.id.endswith("-aaaa") and second.id.endswith("-bbbb") and first.profile != second.profile


def test_env_layers_later_wins_and_empty_unsets():
    p = plan(profile_env={"NVIDIA_TF32_OVERRIDE": "0", "A": "p"}, cli_env={"A": "cli", "PYTORCH_CUDA_ALLOC_CONF": ""})
    assert p.exported["NVIDIA_TF32_OVERRIDE"] == "0" and p.vars["NVIDIA_TF32_OVERRIDE"].origin == "profile"
    assert p.exported["A"] == "cli"
    assert "PYTORCH_CUDA_ALLOC_CONF" in p.unset and "PYTORCH_CUDA_ALLOC_CONF" not in p.exported
    assert p.exported["WANDB_RUN_NAME"] == "r-1" and p.exported["WANDB_RUN_GROUP"] == "lambda"
    p2 = plan(cli_env={"WANDB_RUN_NAME": "mine"})
    assert p2.exported["WANDB_RUN_NAME"] == "mine"


def test_seed_exports_and_reserved_names():
    p = plan(seed=7, cli_env={"GPUOPS_RUN_ID": "evil", "PYTHONHASHSEED": "1"})
    assert p.exported["GPUOPS_SEED"] == "7" and p.exported["PYTHONHASHSEED"] == "7"
    assert "GPUOPS_RUN_ID" not in p.exported
    assert any("GPUOPS_RUN_ID" in x for x in p.warnings) and any("PYTHONHASHSEED" in x for x in p.warnings)


def test_unknown_preset_is_a_usage_error():
    with pytest.raises(UsageError, match="unknown env_preset 'b300'"):
        plan(preset="b300")


def test_secrets_are_kept_apart_and_never_printed():
    p = plan(secret_names=["HF_TOKEN", "MISSING"], local_env={"WANDB_API_KEY": "wk-123", "HF_TOKEN": "hf-456"},
             profile_env={"OTHER_SECRET": "zzz"}, dotenv_names=["HF_TOKEN"])
    # OTHER_SECRET: a name that looks secret is a secret wherever it is given (issue #28)
    assert p.secrets == {"WANDB_API_KEY": "wk-123", "HF_TOKEN": "hf-456", "OTHER_SECRET": "zzz"}
    assert "WANDB_API_KEY" not in p.exported and "HF_TOKEN" not in p.exported and "OTHER_SECRET" not in p.exported
    text = "\n".join(p.lines())
    assert "wk-123" not in text and "hf-456" not in text
    assert "HF_TOKEN=<secret, from .env>" in text and "WANDB_API_KEY=<secret, from local environment>" in text
    assert p.missing_secrets == ["MISSING"] and any("MISSING" in x for x in p.warnings)
    # a secret given through --env is still a secret
    p2 = plan(secret_names=["HF_TOKEN"], cli_env={"HF_TOKEN": "cli-secret"})
    assert p2.secrets["HF_TOKEN"] == "cli-secret" and "HF_TOKEN" not in p2.exported


def test_conflicts_from_presets_yaml():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert core.conflict_warnings(env, PRESETS, {"vllm": "0.12.0"})[0].startswith("expandable segments vs vLLM V1 (vllm 0.12.0")
    assert core.conflict_warnings(env, PRESETS, {"vllm": "0.6.3"}) == []
    assert core.conflict_warnings(env, PRESETS, {"vllm": None}) == []
    assert "if the job uses vllm" in core.conflict_warnings(env, PRESETS, None)[0]
    assert core.conflict_warnings({}, PRESETS, {"vllm": "0.12.0"}) == []
    assert core.conflict_packages(PRESETS) == ["vllm"]
    # the shipped playbook has the documented presets and the conflict
    doc = core.load_presets(Path("/nonexistent"))
    assert doc["presets"]["blackwell-rtxpro"]["env"]["TORCH_CUDA_ARCH_LIST"]["value"] == "12.0+PTX"
    assert core.conflict_warnings({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, doc, {"vllm": "0.12.0"})


def test_parse_env_args():
    assert core.parse_env_args(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    for bad in ("NOEQ", "1A=2", "A B=1"):
        with pytest.raises(UsageError):
            core.parse_env_args([bad])


def test_state_model():
    mk = lambda line: core.parse_state_line(line)  # noqa: E731
    run = mk("RUN id=a exists=1 pid=10 alive=1 rc= started=100 ended= size=5 stop=-")
    assert run.state == core.RUNNING and run.pid == 10 and run.log_size == 5 and run.elapsed(160) == 60
    assert mk("RUN id=a exists=1 pid=10 alive=0 rc=0 started=100 ended=130 size=5 stop=-").state == core.SUCCEEDED
    failed = mk("RUN id=a exists=1 pid=10 alive=0 rc=3 started=100 ended=130 size=5 stop=-")
    assert failed.state == core.FAILED and core.exit_for_state(failed) == 1 and failed.exit_code == 3
    stopped = mk('RUN id=a exists=1 pid=10 alive=0 rc=130 started=1 ended=2 size=0 stop={"signal": "INT", "by": "gpuops stop"}')
    assert stopped.state == core.STOPPED and stopped.stopped["signal"] == "INT"
    lost = mk("RUN id=a exists=1 pid=10 alive=0 rc= started=1 ended= size=0 stop=-")
    assert lost.state == core.LOST and core.exit_for_state(lost) == 1
    assert mk("RUN id=a exists=0").state == core.LOST
    assert core.cost(1800, 2.49) == 1.25 and core.cost(10, None) is None
    assert core.fmt_duration(3725) == "1h02m05s" and core.fmt_duration(65) == "1m05s"


def test_parse_preflight():
    text = ("@gpu\n0, NVIDIA H100 PCIe, 81559 MiB\n@gpu_rc 0\n@df\n/dev/sda1 1000 10 5242880 1% /\n"
            "@active\nold-20250101-000000\n@script 1\n@pkg\nvllm=0.12.0\ntorch=\n@end\n")
    pf = core.parse_preflight(text)
    assert pf.gpus == ["0, NVIDIA H100 PCIe, 81559 MiB"] and pf.gpu_error is None
    assert pf.free_gb == 5.0 and pf.active == ["old-20250101-000000"]
    assert pf.packages == {"vllm": "0.12.0", "torch": None}
    bad = core.parse_preflight("@gpu\nNVIDIA-SMI has failed because it couldn't communicate\n@gpu_rc 9\n@df\n@active\n")
    assert bad.gpu_error.startswith("NVIDIA-SMI has failed") and not bad.gpus


def test_job_argv():
    assert core.job_argv("t.py", ["--a"], "python3") == ["python3", "-u", "t.py", "--a"]
    assert core.job_argv("t.py", [], "~/venv/bin/python -X dev") == ["~/venv/bin/python", "-X", "dev", "-u", "t.py"]
    assert core.job_argv("run.sh", ["x"]) == ["bash", "run.sh", "x"]
    assert core.job_argv("run.sh", ["x"], shebang="/usr/bin/env bash") == ["/usr/bin/env", "bash", "run.sh", "x"]
    assert core.job_argv("run.sh", [], shebang="/bin/sh -e") == ["/bin/sh", "-e", "run.sh"]
    assert core.job_argv("t.py", [], "python3", shebang="/usr/bin/python2") == ["python3", "-u", "t.py"]
    assert core.job_argv("train", []) == ["./train"]


def test_read_shebang(tmp_path):
    (tmp_path / "a.sh").write_text("#!/usr/bin/env bash\nset -e\n")
    (tmp_path / "b.sh").write_text("echo no shebang\n")
    assert core.read_shebang(tmp_path / "a.sh") == "/usr/bin/env bash"
    assert core.read_shebang(tmp_path / "b.sh") is None and core.read_shebang(tmp_path / "missing.sh") is None


def test_registry_resolution(tmp_path):
    for rid, prof, ts in (("a-1", "p", 1), ("a-2", "p", 2), ("b-1", "q", 3)):
        core.save_local({"run_id": rid, "profile": prof, "started_ts": ts}, tmp_path)
    assert core.resolve_run(None, "p", tmp_path)["run_id"] == "a-2"
    assert core.resolve_run("a-1", "p", tmp_path)["run_id"] == "a-1"
    with pytest.raises(UsageError, match="matches 2 runs"):
        core.resolve_run("a-", "p", tmp_path)
    with pytest.raises(UsageError, match="belongs to profile 'q'"):
        core.resolve_run("b-1", "p", tmp_path)
    with pytest.raises(UsageError, match="no runs of profile 'z'"):
        core.resolve_run(None, "z", tmp_path)


def test_launcher_runs_hostile_argv_literally_and_records_exit(tmp_path):
    """The generated launcher, run by a local sh: literal arguments, env, exit code, secrets sourced and deleted."""
    proj = tmp_path / "proj"
    proj.mkdir()
    args = ["a b", "$(touch PWNED)", "`touch PWNED`", "; exit 9", "'\""]
    argv = ["sh", "-c", 'printf "%s\\n" "$@" > argv.txt; echo "$FOO|$SECRET|${DROP-unset}" > env.txt; exit 5', "x", *args]
    script = rl.launcher_script(run_id="r-1", remote_dir=str(proj), argv=argv, python="python3",
                                env={"FOO": "it's $HOME"}, unset=["DROP"])
    d = tmp_path / "run"
    d.mkdir()
    (d / "launch.sh").write_text(script)
    (d / "secrets.env").write_text("SECRET='s3'; export SECRET\n")
    env = {**os.environ, "DROP": "was-set"}
    rc = subprocess.run(["sh", str(d / "launch.sh")], env=env, cwd=tmp_path).returncode
    assert rc == 5 and (d / "exit_code").read_text().strip() == "5"
    assert (proj / "argv.txt").read_text().splitlines() == args
    assert (proj / "env.txt").read_text().strip() == "it's $HOME|s3|unset"
    assert not (d / "secrets.env").exists() and not list(tmp_path.rglob("PWNED"))
    assert (d / "pid").read_text().strip().isdigit() and (d / "started").is_file() and (d / "ended").is_file()


def test_bundle_creates_the_secrets_file_private_before_writing_and_keeps_values_off_command_lines():
    meta = {"run_id": "r", "secrets": ["WANDB_API_KEY"]}
    launcher = rl.launcher_script(run_id="r", remote_dir="~/p", argv=["python3", "-u", "t.py"], python="python3",
                                  env={}, unset=[])
    bundle = rl.launch_bundle(run_id="r", remote_dir="~/p", meta=meta, launcher=launcher,
                              secrets={"WANDB_API_KEY": "VALUE'x"}, python="python3")
    umask = bundle.index("umask 077")
    create = bundle.index(': > "$D/secrets.env"')
    write = bundle.index('cat >> "$D/secrets.env"')
    assert umask < create < write and 'chmod 600 "$D/secrets.env"' in bundle
    assert "VALUE'x" not in launcher and "VALUE" not in json.dumps(meta)
    assert "WANDB_API_KEY='VALUE'\"'\"'x'; export WANDB_API_KEY" in bundle  # only inside a quoted here-document
    assert "setsid -f nohup sh" in bundle and "</dev/null" in bundle
    subprocess.run(["sh", "-n"], input=bundle, text=True, check=True)
    subprocess.run(["sh", "-n"], input=launcher, text=True, check=True)


def test_stream_parsing_and_error_classes():
    ev = w.parse_stderr_line("G 0, NVIDIA H100 PCIe, 95, 48935, 81559, 63, 290.00")
    assert ev["gpu"] == {"index": 0, "name": "NVIDIA H100 PCIe", "util": 95.0, "mem_used": 48935.0,
                         "mem_total": 81559.0, "temp": 63.0, "power": 290.0}
    assert w.parse_stderr_line("G 1, Weird, Name, 5, [N/A], 10, 30, 40.5")["gpu"]["name"] == "Weird, Name"
    assert w.parse_stderr_line("G NVIDIA-SMI has failed")["type"] == "gpu_error"
    assert w.parse_stderr_line("PS 123, python3, 48000;456, torchrun, 10;")["processes"] == [
        {"pid": 123, "name": "python3", "mem_used": 48000.0}, {"pid": 456, "name": "torchrun", "mem_used": 10.0}]
    assert w.parse_stderr_line("END") == {"type": "end"}
    assert w.parse_stderr_line("something else") is None
    assert w.classify("Traceback (most recent call last):") == "error"
    assert w.classify("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == "error"
    assert w.classify("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp") == "error"
    assert w.classify("step 10 loss=nan lr=1e-6") == "error" and w.classify("step 3 loss: inf") == "error"
    assert w.classify("step 10 loss=0.42") is None
    assert w.classify("UserWarning: something") == "warning"


def test_dashboard_model_and_render():
    t = [1000.0]
    dash = w.Dashboard({"run_id": "r-1", "started_ts": 400.0}, price_per_hour=3.6, clock=lambda: t[0])
    for u in (0, 50, 100):
        dash.apply({"type": "sample", "gpu": {"index": 0, "name": "H100", "util": u, "mem_used": 40000,
                                              "mem_total": 80000, "temp": 60, "power": 300}})
    dash.apply({"type": "state", "info": core.parse_state_line("RUN id=r-1 exists=1 pid=1 alive=1 rc= started=100 "
                                                               "ended= size=0 stop=-")})
    dash.apply({"type": "log", "line": "Traceback (most recent call last):"})
    assert dash.state == "running" and dash.elapsed() == 900 and dash.cost() == 0.9 and dash.errors == 1
    from gpuops.jobs.screen import sparkline
    assert sparkline(dash.gpus[(0, 0)].util) == "▁▅█"
    assert "r-1: running, elapsed 15m00s, cost $0.90" == dash.state_text()
    dash.apply({"type": "reconnecting", "attempt": 2, "delay": 2.0, "error": "lost"})
    assert dash.link.startswith("reconnecting")
    from rich.console import Console

    con = Console(record=True, width=120)
    con.print(w.render(dash))
    text = con.export_text()
    assert "H100" in text and "reconnecting" in text and "Traceback" in text


def test_stream_command_is_one_shell_with_offset_and_quoting():
    cmd = w.stream_command("r;x", "~/p q/.gpuops/runs/r;x", offset=1234, interval=2.0)
    assert "tail --pid=$$ -c +1235 -F" in cmd and "-lms 2000" in cmd
    assert "'r;x'" in cmd and "\"$HOME\"/'p q/.gpuops/runs/r;x'" in cmd
    subprocess.run(["sh", "-n"], input=cmd, text=True, check=True)
    assert shlex.quote("r;x") in rl.stop_script("r;x", "~/p/.gpuops/runs/r;x", 1.5)


# -- preflight judgement, status rows, script paths (pure decisions of `train` and `status`) -------------------
PF_OK = "@gpu\n0, NVIDIA H100 PCIe, 81559 MiB\n@gpu_rc 0\n@df\n/dev/sda1 1000 10 52428800 1% /\n@active\n@script 1\n@end\n"
PF_BAD = ("@gpu\nNVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver\n@gpu_rc 9\n"
          "@df\n/dev/sda1 1000 10 524288 1% /\n@active\nold-20250101-000000\n@end\n")


def judge(text: str, **kw):
    args = dict(script_found=True, script="train.py", remote_dir="~/proj", min_disk_gb=None, force=False, synced=True)
    args.update(kw)
    return core.judge_preflight(core.parse_preflight(text), **args)


def test_preflight_judgement_passes_a_healthy_host():
    v = judge(PF_OK, min_disk_gb=20)
    assert v.error is None and v.warnings == []


def test_preflight_judgement_refuses_no_gpu_low_disk_and_another_run_unless_forced():
    from gpuops.errors import ChecksFailed

    v = judge(PF_BAD, min_disk_gb=20)
    assert isinstance(v.error, ChecksFailed) and v.warnings == []
    assert v.error.message == ("no GPU visible: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                               "driver; only 0.5 GB free in ~/proj (the profile expects 20 GB); another gpuops run is "
                               "still running on the host: old-20250101-000000; not launching")
    assert v.error.hint == "stop it first (gpuops stop old-20250101-000000) or add --force to launch anyway"
    forced = judge(PF_BAD, min_disk_gb=20, force=True)
    assert forced.error is None and len(forced.warnings) == 3
    assert all(w.endswith(" (--force: launching anyway)") for w in forced.warnings)


def test_preflight_judgement_warns_under_one_gigabyte_without_an_expectation():
    text = PF_OK.replace("52428800", "524288")
    assert judge(text).warnings == ["only 0.50 GB free on the host; checkpoints may not fit"]
    v = judge(text, min_disk_gb=0.25)  # the profile's floor is met: the same warning, not a problem
    assert v.error is None and v.warnings == ["only 0.50 GB free on the host; checkpoints may not fit"]


def test_preflight_judgement_missing_script_is_a_usage_error_whatever_force_says():
    v = judge(PF_BAD.replace("52428800", "524288"), script_found=False, force=True, synced=False)
    assert isinstance(v.error, UsageError) and v.error.message == "script not found on the host: ~/proj/train.py"
    assert v.error.hint == "sync first (drop --no-sync) or check the path"
    # shown before the error (as before the judgement was pure); the problems are not reported as forced
    assert v.warnings == ["only 0.50 GB free on the host; checkpoints may not fit"]
    assert judge(PF_OK, script_found=False).error.hint == "check the path; is it excluded from sync?"


def test_status_rows_newest_first_with_local_or_remote_start():
    infos = {"a": core.parse_state_line("RUN id=a exists=1 pid=1 alive=0 rc=0 started=100 ended=160 size=0 stop=-"),
             "b": core.parse_state_line("RUN id=b exists=1 pid=2 alive=1 rc= started=200 ended= size=0 stop=-")}
    metas = {"a": {"script": "a.py"}, "b": {"script": "b.py"}, "c": {"script": "c.py", "started_ts": 50}}
    rows = core.status_rows(metas, infos, now=260)
    assert [(r["run_id"], r["state"], r["elapsed"], r["started"]) for r in rows] == [
        ("b", "running", 60, 200), ("a", "succeeded", 60, 100), ("c", "lost", None, 50)]
    assert rows[1]["exit_code"] == 0 and rows[0]["pid"] == 2 and rows[2]["script"] == "c.py"


def test_script_path_is_relative_to_the_project(tmp_path):
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "t.py").write_text("")
    assert core.script_path("scripts/t.py", tmp_path, must_exist=True) == "scripts/t.py"
    assert core.script_path(str(tmp_path / "scripts" / "t.py"), tmp_path, must_exist=True) == "scripts/t.py"
    assert core.script_path("not/synced.py", tmp_path, must_exist=False) == "not/synced.py"
    for bad, exist in (("missing.py", True), ("/elsewhere/t.py", False), ("../t.py", False)):
        with pytest.raises(UsageError):
            core.script_path(bad, tmp_path, must_exist=exist)


# -- the stream model: whole lines, raw byte offsets ---------------------------------------------------------------
SAMPLE = b"G 0, NVIDIA H100 PCIe, 95, 48935, 81559, 63, 290.00\n"


def test_a_long_log_line_arriving_in_chunks_stays_whole_and_a_sample_between_its_chunks_is_its_own_event():
    fs = w.FollowState(offset=100)
    m = w.StreamModel(fs)
    long = b"x" * 300_000
    events = m.log_bytes(b"before\n" + long[:65536])
    events += m.tag_bytes(SAMPLE[:20])  # a tagged line split across chunks too
    for i in range(65536, len(long), 65536):
        events += m.log_bytes(long[i:i + 65536])
        events += m.tag_bytes(SAMPLE[20:] if i == 65536 else SAMPLE)
    events += m.log_bytes(b"\nafter\n")
    logs = [e for e in events if e["type"] == "log"]
    assert [e["line"] for e in logs] == ["before", "x" * 300_000, "after"]
    assert [e["offset"] for e in logs] == [107, 107 + 300_001, 107 + 300_001 + 6] and fs.offset == 300_114
    samples = [e for e in events if e["type"] == "sample"]
    assert len(samples) == 4 and all(e["gpu"]["util"] == 95.0 and e["gpu"]["name"] == "NVIDIA H100 PCIe"
                                     for e in samples)
    # the samples that arrived while the long line was incomplete are delivered before it, not after
    assert [e["type"] for e in events].index("sample") < events.index(logs[1])


def test_invalid_utf8_counts_raw_bytes_in_the_stream_and_in_the_rest_fetched_after_the_end():
    fs = w.FollowState(offset=0)
    m = w.StreamModel(fs)
    ev = m.log_bytes(b"ok\nbad \xff\xfe\xc3 end\npart\xff")
    assert [(e["line"], e["offset"]) for e in ev] == [("ok", 3), ("bad \ufffd\ufffd\ufffd end", 15)]
    assert fs.offset == 15 == len(b"ok\nbad \xff\xfe\xc3 end\n")
    ev = m.tag_bytes(b"H 1700000000\nRUN id=r exists=1 pid=1 alive=0 rc=0 started=1 ended=2 size=33 stop=-\nEND\n")
    assert [e["type"] for e in ev] == ["heartbeat", "state", "end"] and m.ended and fs.info.log_size == 33
    assert ev[0]["at"] == 1700000000.0  # the host's clock: how far behind a follower reads (the dashboard says it)
    # after END the bytes from fs.offset are fetched again: the incomplete line the stream held is replaced
    m.restart_log()
    rest = m.rest_of_log(b"part\xff\n\xfflast \xe2\x82 no newline")
    assert [(e["line"], e["offset"]) for e in rest] == [("part\ufffd", 21), ("\ufffdlast \ufffd no newline", 40)]
    assert fs.offset == 40 == 15 + len(b"part\xff\n\xfflast \xe2\x82 no newline")


def test_line_splitter_bounds_a_line_without_newlines():
    s = w.LineSplitter(max_line=4)
    assert s.feed_pieces(b"abcdefghij") == [(b"abcd", False), (b"efgh", False)] and s.pending == b"ij"
    assert s.feed_pieces(b"k\nxy\n") == [(b"ijk", True), (b"xy", True)] and s.pending == b""
    m = w.StreamModel(w.FollowState(offset=0))
    m.log = w.LineSplitter(max_line=4)
    ev = m.log_bytes(b"123456\n")
    assert [(e["raw"], e["nl"], e["offset"]) for e in ev] == [(b"1234", False, 4), (b"56", True, 7)]


def test_safe_text_neutralises_terminal_control_sequences():
    assert w.safe_text("step 1 \x1b[2J\x1b]0;pwned\x07loss 0.5") == "step 1 \\x1b[2J\\x1b]0;pwned\\x07loss 0.5"
    assert w.safe_text("10%|#  |\r50%|##  |\r") == "50%|##  |"
    assert w.safe_text("tab\tkept \u00e9") == "tab\tkept \u00e9"
    assert w.safe_text("\x9b31m c1 CSI") == "\\x9b31m c1 CSI"


def test_line_splitter_keeps_an_incomplete_line_until_its_newline():
    s = w.LineSplitter()
    assert s.feed(b"a") == [] and s.feed(b"b\nc") == [b"ab"] and s.pending == b"c"
    assert s.feed(b"\n\n") == [b"c", b""] and s.pending == b""


class LocalRemote:
    """Runs `remote` commands with the local sh, returning text decoded as Remote.run decodes it."""

    def run(self, command, *, timeout=60, stdin=None, check=False):
        from gpuops.remote.connection import Result

        p = subprocess.run(["sh", "-c", command], capture_output=True, timeout=timeout,
                           input=stdin.encode() if isinstance(stdin, str) else stdin)
        return Result(p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"), 0.0)


def test_stream_from_returns_the_log_bytes_exactly_in_chunks(tmp_path, sandbox):
    from gpuops.profiles import model as profiles
    from gpuops.remote.connection import connect

    data = b"one\nbad \xff\xfe line\n" + bytes(range(256)) * 600 + b"\nlast \xc3 without newline"
    (tmp_path / "log").write_bytes(data)
    with connect(profiles.resolve("sandbox"), announce=lambda m: None) as remote:
        chunks = list(rl.stream_from(remote, str(tmp_path), 4, len(data), chunk=4096))
        assert b"".join(chunks) == data[4:] and len(chunks) > 1 and max(map(len, chunks)) <= 4096
        assert b"".join(rl.stream_from(remote, str(tmp_path), 0, 10)) == data[:10]
        assert list(rl.stream_from(remote, str(tmp_path), 10, 10)) == []
        with pytest.raises(Exception, match="could not read the end of the log"):
            list(rl.stream_from(remote, str(tmp_path / "missing"), 0, 10))


def test_start_offset_is_counted_in_raw_bytes(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    (d / "pid").write_text("1")
    (d / "log").write_bytes(b"a\xff\xfe\n" * 5 + b"b\xff\n" * 2 + b"partial \xff")
    info, start = w.start_position(LocalRemote(), "r", str(d), 2)
    assert info.exists and start == 4 * 5 + 3  # the last 2 lines: the second "b" line and the partial one
    assert w.start_position(LocalRemote(), "r", str(d), 0)[1] == len((d / "log").read_bytes())


def test_follow_to_end_returns_false_on_ctrl_c():
    def connect():
        raise KeyboardInterrupt

    dash = w.Dashboard({"run_id": "r"})
    assert w.follow_to_end(connect, "r", "/x", w.FollowState(offset=0), dash, interval=1, samples=False) is False


def test_event_rendering_json_and_plain():
    dash = w.Dashboard({"run_id": "r-1"}, clock=lambda: 0.0)
    sample = w.parse_stderr_line(SAMPLE.decode().strip())
    g = sample["gpu"]
    assert w.event_doc(sample, 12.34567) == {  # docs/json.md: ISO times with a zone, GPU memory in MiB
        "type": "sample", "at": "1970-01-01T00:00:12.345+00:00", "index": g["index"], "name": g["name"],
        "util": g["util"], "mem_used_mib": g["mem_used"], "mem_total_mib": g["mem_total"], "temp": g["temp"],
        "power": g["power"]}
    assert w.event_doc({"type": "log", "line": "Traceback (most recent call last):", "offset": 9}, 1) == {
        "type": "log", "at": "1970-01-01T00:00:01.000+00:00", "line": "Traceback (most recent call last):",
        "offset": 9, "kind": "error"}
    assert w.event_doc({"type": "reconnecting", "attempt": 2, "delay": 2.0, "error": "lost"}, 1)["delay_s"] == 2.0
    assert w.event_doc({"type": "end"}, 1) is None and w.event_text({"type": "end"}, dash, "t") is None
    assert w.event_text(sample, dash, "12:00:00") == "12:00:00 gpu0 util=95% mem=48935/81559MiB temp=63C power=290W"
    assert w.event_text({"type": "log", "line": "UserWarning: x"}, dash, "t") == "t log ~ UserWarning: x"
    assert w.event_text({"type": "processes", "processes": []}, dash, "t") == "t gpu processes: none"
    assert w.event_text({"type": "reconnecting", "attempt": 2, "delay": 2.0, "error": "lost"}, dash, "t") == \
        "t reconnecting (attempt 2, in 2s): lost"


def test_preflight_judgement_refuses_a_launcher_whose_package_the_python_lacks():
    from gpuops.errors import ChecksFailed

    no_torch = PF_OK.replace("@end", "@pkg\ntorch=\n@end")
    v = judge(no_torch, launcher="torchrun", python="~/.venvs/gpuops/bin/python")
    assert isinstance(v.error, ChecksFailed)
    assert v.error.message.startswith("--launcher torchrun needs torch, and ~/.venvs/gpuops/bin/python has no torch")
    assert "run gpuops setup" in v.error.hint
    assert judge(no_torch, launcher="none").error is None  # the script itself: no launcher package needed
    assert judge(PF_OK.replace("@end", "@pkg\ntorch=2.13.0+cpu\n@end"), launcher="torchrun").error is None
    assert judge(PF_OK.replace("@end", "@pkg\nray=\n@end"), launcher="ray").error is not None
    assert judge(no_torch, launcher="torchrun", force=True).error is None  # --force: a warning


def test_dashboard_keeps_each_hosts_gpus_apart_and_signals_follow_the_watched_host():
    dash = w.Dashboard({"run_id": "r"}, host=0, signal_spec={})
    g = {"index": 0, "name": "H100", "util": 90.0, "mem_used": 1.0, "mem_total": 2.0, "temp": 40.0, "power": 100.0}
    dash.apply({"type": "sample", "gpu": dict(g)})
    dash.apply({"type": "sample", "gpu": dict(g, util=5.0), "host": 1})
    assert sorted(dash.gpus) == [(0, 0), (1, 0)]
    assert list(dash.gpus[(1, 0)].util) == [5.0] and dash.gpus[(1, 0)].host == 1
    dash.apply({"type": "gpu_error", "host": 1, "message": "NVIDIA-SMI has failed"})
    assert dash.gpu_error == "host #1: NVIDIA-SMI has failed"
    ev = {"type": "sample", "gpu": dict(g), "host": 1}
    assert w.event_text(ev, dash, "12:00:00").startswith("12:00:00 host#1 gpu0 util=90%")
    assert w.event_doc(ev, 1.0)["rank"] == 1 and "host" not in w.event_doc(ev, 1.0)  # `host` is an address
    assert "rank" not in w.event_doc({"type": "sample", "gpu": dict(g)}, 1.0)  # a one-host run: as before
    import io

    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, width=120).print(w.render(dash))
    assert "#0/0" in buf.getvalue() and "#1/0" in buf.getvalue()  # a row per host and GPU


def test_no_command_of_the_launcher_before_the_job_carries_the_runs_mark(tmp_path):
    """The launcher's pid sampler lists every process carrying GPUOPS_RUN_DIR as the job's; a command the launcher
    itself runs between the mark's export and the job (the `mv` of its job marker) was listed too, and a list with
    only that pid made the job's own OOM kill (a pid the list lacked) look like another process's, in a fresh-clone
    CI run. Every external command the launcher runs is wrapped here to record whether it carries the mark."""
    proj, d, tools = tmp_path / "proj", tmp_path / "run", tmp_path / "tools"
    for x in (proj, d, tools):
        x.mkdir()
    seen = tmp_path / "seen"
    for tool in ("mv", "date", "sed", "cat", "sort", "grep", "wc", "tr", "sleep", "df", "timeout", "rm"):
        real = shutil.which(tool)
        if real:
            (tools / tool).write_text(f'#!/bin/sh\n[ -n "${{GPUOPS_RUN_DIR-}}" ] && echo {tool} >> {seen}\n'
                                      f'exec {real} "$@"\n')
            (tools / tool).chmod(0o755)
    script = rl.launcher_script(run_id="r-1", remote_dir=str(proj), argv=["sh", "-c", "exit 0"], python="python3",
                                env={}, unset=[])
    (d / "launch.sh").write_text(script)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
    assert subprocess.run(["sh", str(d / "launch.sh")], env=env, cwd=tmp_path).returncode == 0
    marked = seen.read_text().split() if seen.exists() else []
    assert "mv" not in marked, marked  # the job marker's mv, just before the job

"""Training signals (signals.py over playbooks/signals.yaml) on crafted logs and GPU samples: each raised once with
its hint, progress parsed from the common formats, false alarms quiet. watch/status e2e: test_signals_e2e.py."""
from pathlib import Path

import pytest

from gpuops.jobs import signals as sg
from gpuops.jobs.watch import Dashboard, signal_docs, signal_lines
from support import DATA


SPEC = sg.load_spec(Path("/nonexistent"))
OOM = DATA / "logs" / "torch-2.11-oom-message.txt"  # copied from a real torch 2.11 OOM
OOM_TEXT = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1024.00 MiB. GPU 0 has a total capacity of "
            "79.18 GiB of which 673.19 MiB is free. Including non-PyTorch memory, this process has 78.51 GiB memory in use.")


def ids(model, lines, t0=0.0):
    out = []
    for i, ln in enumerate(lines):
        out += [s["id"] for s in model.line(ln, t0 + i)]
    return out


def test_every_signal_names_its_source_and_hint():
    for s in SPEC["signals"]:
        assert s["hint"] and s["source"], s["id"]
    assert SPEC["zero_loss"]["source"].startswith("seeds/004") and SPEC["gpu_idle"]["source"].startswith("seeds/004")


@pytest.mark.parametrize("line,sid,hint_words", [
    (OOM_TEXT, "cuda-oom", ["gpu_memory_utilization", "max_num_batched_tokens", "micro-batch", "rollout group size"]),
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "cuda-oom", ["max_response_length"]),
    ("NCCL WARN NET/IB : Got async event : port error", "nccl-network", ["NCCL_IB_DISABLE=1"]),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
     "nccl-network", ["NCCL_IB_DISABLE=1"]),
    ("No non-zero advantages in batch (nothing to train on)", "rl-no-advantages", ["-n"]),
    ("ValueError: All token advantages are 0.0", "rl-no-advantages", ["reward"]),
    ("Logprob mismatch: max_abs_diff=0.82 > tol", "logprob-mismatch", ["dtype"]),
    ("step 12 loss=nan", "nan-loss", ["learning rate"]),
    ("step 31 loss nan", "nan-loss", ["learning rate"]),  # the `step N loss X` format the dashboard and watch read
    ("step 3/80 | loss inf | 900 tokens/s", "nan-loss", ["learning rate"]),
    ("Epoch 0: 45%|####5     | 450/1000 [00:30<00:36, 15.00it/s, v_num=0, train_loss=nan]", "nan-loss", ["bf16"]),
])
def test_log_signals_raised_once_with_hint(line, sid, hint_words):
    m = sg.SignalModel(SPEC)
    assert ids(m, [line, line, "ok", line]) == [sid]
    sig = m.raised[sid]
    for w in hint_words:
        assert w in sig["hint"], (w, sig["hint"])
    assert sig["line"] == line[:300]


def test_real_torch_211_oom_message():
    text = OOM.read_text().strip()
    assert ids(sg.SignalModel(SPEC), [text]) == ["cuda-oom"]


@pytest.mark.parametrize("line", [
    "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>", "NCCL version 2.21.5+cuda12.4",
    "advantages: mean 0.12 std 0.4 (nonzero 512)", "Logprob check ok, max_abs_diff=1e-4",
    "loss: 0.0012", "memory: 40 GiB used, no out-of-memory", "step 3 loss 0.5 grad_norm nan_count=0",
    "loss information follows",
])
def test_false_alarms_stay_quiet(line):
    assert ids(sg.SignalModel(SPEC), [line]) == []


def test_loss_stuck_at_zero_for_several_steps():
    m = sg.SignalModel(SPEC)
    assert ids(m, ["Step 1 | Loss: 0.0000", "Step 2 | Loss: 0.0000"]) == []
    assert ids(m, ["Step 3 | Loss: 0.0000"]) == ["zero-loss"]
    assert ids(m, ["Step 4 | Loss: 0.0000"]) == []  # once
    m2 = sg.SignalModel(SPEC)  # zeros interrupted by a real loss: quiet
    assert ids(m2, ["step 1 loss 0.0", "step 2 loss 0.0", "step 3 loss 0.31", "step 4 loss 0.0", "step 5 loss 0.0"]) == []


def test_progress_formats():
    m = sg.SignalModel(SPEC)
    m.line("step:3 - actor/pg_loss:0.031 - critic/score/mean:0.5 - timing_s/step:12.5", 0)
    assert (m.step, m.loss, m.format) == (3, 0.031, "verl")
    m = sg.SignalModel(SPEC)
    m.line("{'loss': 1.2345, 'grad_norm': 3.2, 'learning_rate': 5e-05, 'epoch': 0.5}", 0)
    m.line("{'eval_loss': 0.9, 'epoch': 0.5}", 0)  # an eval dict is not a training step
    m.line("{'loss': 1.1, 'grad_norm': 3.0, 'learning_rate': 4e-05, 'epoch': 1.0}", 0)
    assert (m.step, m.loss, m.format, list(m.losses)) == (2, 1.1, "hf-trainer", [1.2345, 1.1])
    m = sg.SignalModel(SPEC)
    m.line("step 40/200 | loss 0.512 | lr 1e-4", 0)
    assert (m.step, m.total, m.loss) == (40, 200, 0.512)
    m = sg.SignalModel(SPEC)
    m.line("Training: total_training_steps=220", 0)
    m.line("step 10 ... loss 2.5e-01", 0)
    assert (m.total, m.step, m.loss) == (220, 10, 0.25)


def test_rate_time_left_cost_and_sparkline():
    m = sg.SignalModel(SPEC, started=1000.0, price_per_hour=3.0)
    m.line("total_training_steps: 200", 1000)
    for i in range(1, 11):
        m.line(f"step {i * 10} loss {2.0 / i:.3f}", 1000 + 60 * i)  # 10 steps/min
    p = m.progress(1600.0)
    assert p["step"] == 100 and p["steps_per_min"] == 10.0
    assert p["seconds_left"] == 600  # 100 steps at 10/min
    assert p["cost_at_end"] == round((600 + 600) / 3600 * 3.0, 2)
    assert p["sparkline"][0] == "█" and p["sparkline"][-1] == "▁" and len(p["sparkline"]) == 10
    text = sg.progress_text(p)
    assert "step 100/200" in text and "10 steps/min" in text and "10m" in text and "$1.00 at the end" in text


def test_gpu_idle_for_the_first_minutes():
    m = sg.SignalModel(SPEC)
    g0 = {"index": 0, "util": 0.0}
    assert m.sample(g0, 0) == [] and m.sample(g0, 120) == []
    assert [s["id"] for s in m.sample(g0, 181)] == ["gpu-idle"]
    assert m.sample(g0, 400) == []  # once
    m2 = sg.SignalModel(SPEC)  # the GPU worked once: a later idle stretch is not the CPU-only torch's signal, but
    m2.sample({"index": 0, "util": 95.0}, 0)  # said as what it is once it lasts the same minutes (issue #35)
    assert m2.sample(g0, 10) == [] and m2.sample(g0, 120) == []
    went = m2.sample(g0, 200)
    assert [s["id"] for s in went] == ["gpu-went-idle"] and "after it worked" in went[0]["title"]
    assert "py-spy" in went[0]["hint"] and m2.sample(g0, 500) == []


def test_status_idle_now():
    g = [{"index": 0, "util": 0.0}, {"index": 1, "util": 0.0}]
    assert sg.idle_now(SPEC, g, 200.0)[0]["id"] == "gpu-idle"
    assert sg.idle_now(SPEC, g, 60.0) == []
    assert sg.idle_now(SPEC, [{"index": 0, "util": 0.0}, {"index": 1, "util": 50.0}], 600.0) == []


def test_user_adds_their_trainers_signal():
    spec = {**SPEC, "signals": SPEC["signals"] + [{"id": "reward-hacking", "title": "reward hacking", "match": "reward > 0.99",
                                                   "hint": "inspect samples", "source": "our runbook"}]}
    assert ids(sg.SignalModel(spec), ["epoch 3 reward > 0.99 for 50 steps"]) == ["reward-hacking"]


def test_dashboard_carries_signals_into_events():
    t = [100.0]
    dash = Dashboard({"run_id": "r", "started_ts": 100.0}, price_per_hour=2.0, clock=lambda: t[0], signal_spec=SPEC)
    ev = {"type": "log", "line": "No non-zero advantages in batch", "offset": 1}
    dash.apply(ev)
    assert [s["id"] for s in ev["signals"]] == ["rl-no-advantages"]
    docs = signal_docs(ev, 1.0)
    assert docs[0]["type"] == "signal" and docs[0]["id"] == "rl-no-advantages" and docs[0]["hint"]
    assert signal_lines(ev, "12:00:00")[0].startswith("12:00:00 signal: RL training is learning nothing")
    ev2 = {"type": "log", "line": "step 10 loss 0.5", "offset": 2}
    t[0] = 160.0
    dash.apply(ev2)
    assert ev2["progress"]["step"] == 10 and ev2["progress"]["steps_per_min"] == 10.0
    assert any(ln.startswith("12:00:00 progress step 10") for ln in signal_lines(ev2, "12:00:00"))
    assert [s["id"] for s in dash.signals] == ["rl-no-advantages"]


def test_dashboard_screen_shows_progress_and_signals():
    import io

    from rich.console import Console

    from gpuops.jobs.watch import render

    t = [100.0]
    dash = Dashboard({"run_id": "r", "started_ts": 100.0}, price_per_hour=2.0, clock=lambda: t[0], signal_spec=SPEC)
    dash.apply({"type": "log", "line": "total_training_steps: 100", "offset": 1})
    t[0] = 160.0
    dash.apply({"type": "log", "line": "step 10 loss 0.5", "offset": 2})
    dash.apply({"type": "log", "line": "NCCL WARN NET/IB : Got async event : port error", "offset": 3})
    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(render(dash))
    screen = buf.getvalue()
    assert "step 10/100  loss 0.5" in screen and "9m00s left" in screen
    assert "signal: NCCL network error: a single node without InfiniBand: set NCCL_IB_DISABLE=1" in screen


def test_lightning_progress_lines_tqdm_and_rich():
    m = sg.SignalModel(SPEC)
    bar = ("\rEpoch 0:  10%|█         | 100/1000 [00:06<00:54, 16.50it/s, v_num=0, train_loss=0.812]"
           "\rEpoch 0:  45%|████▌     | 450/1000 [00:30<00:36, 15.00it/s, v_num=0, train_loss=0.123]")
    m.line(bar, 0)  # a tqdm bar redrawn in place: its last state counts
    assert (m.step, m.total, m.loss, m.format) == (450, 1000, 0.123, "lightning")
    assert m.throughput == (15.0, "it/s")
    m = sg.SignalModel(SPEC)
    m.line("Epoch 12/20 ━━━━━━━━━━━━━━━━━━ 50/100 0:00:05 • 0:00:05 9.89it/s v_num: 0 train_loss: 0.250", 0)
    assert (m.step, m.total, m.loss, m.throughput) == (50, 100, 0.25, (9.89, "it/s"))
    m = sg.SignalModel(SPEC)
    m.line("Epoch 3: 100%|██████████| 20/20 [00:01<00:00, 12.1it/s, v_num=1]", 0)  # no loss shown: the step alone
    assert (m.step, m.total, m.loss) == (20, 20, None)


def test_throughput_patterns():
    def tp(line):
        m = sg.SignalModel(SPEC)
        m.line(line, 0)
        return m.throughput

    assert tp("step 10 loss 0.5 | 1843.2 tokens/s") == (1843.2, "tokens/s")
    assert tp("{'train_runtime': 12.0, 'train_samples_per_second': 42.5, 'train_loss': 0.3}") == (42.5, "samples/s")
    assert tp("iter 5: samples per sec: 12.5") == (12.5, "samples/s")
    assert tp("step 10 loss 0.5") is None
    m = sg.SignalModel(SPEC)
    m.line("step 10 loss 0.5 1200 tokens/s", 0)
    p = m.progress(0)
    assert (p["throughput"], p["throughput_unit"]) == (1200.0, "tokens/s")
    assert "1200 tokens/s" in sg.progress_text(p)


def test_a_starved_gpu_by_throughput_against_the_runs_own_median():
    """A dataloader-starved job: its throughput falls 25-fold at step 10 (issue #35): raised once, after three
    readings, naming the fall; a single slow reading (a checkpoint save) is not enough."""
    m = sg.SignalModel(SPEC)
    fast = [f"step {i} loss 0.5 120.0 it/s" for i in range(1, 10)]
    assert ids(m, fast + ["step 10 loss 0.5 4.8 it/s", "step 11 loss 0.5 118.0 it/s"]) == []
    got = [s for i in range(12, 15) for s in m.line(f"step {i} loss 0.5 4.8 it/s", float(i))]
    assert [s["id"] for s in got] == ["throughput-drop"]
    assert got[0]["title"] == "throughput fell to 4.8 it/s from this run's median 120 (25x slower)"
    assert "num_workers" not in got[0]["title"] and "DataLoader workers" in got[0]["hint"]


def test_gpu_utilisation_low_over_the_whole_run_not_only_its_first_minutes():
    m = sg.SignalModel(SPEC)
    got = []
    for t in range(0, 660, 10):  # 11 minutes at 12 to 20 %: the GPU works, starved
        got += m.sample({"index": 0, "util": 12.0 + (t % 3) * 4}, float(t))
        got += m.sample({"index": 1, "util": 0.0}, float(t))  # a GPU the job does not use: not counted
    assert [s["id"] for s in got] == ["gpu-low"]
    assert got[0]["title"].startswith("GPU utilisation averaged 1") and "over the 10 minutes watched" in got[0]["title"]
    assert "pin_memory=True" in got[0]["hint"]
    busy = sg.SignalModel(SPEC)
    assert not [s for t in range(0, 900, 10) for s in busy.sample({"index": 0, "util": 93.0}, float(t))]


def test_a_killed_line_in_a_sh_wrapper_is_an_error_and_a_signal():
    from gpuops.jobs.watch import classify

    line = "train.sh: line 3:  4242 Killed                  python train.py"
    assert classify(line) == "error"
    assert ids(sg.SignalModel(SPEC), [line]) == ["killed"]

"""Issue #28 (what sync sends, secrets and settings, processes and knowledge): the pure parts. End to end:
tests/test_syncsec_e2e.py."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpuops.jobs import plan as core


def plan(**kw):
    args = dict(preset=None, presets_doc={}, profile_env={}, cli_env={}, secret_names=[], local_env={},
                run_id="r-1", profile_name="lambda")
    args.update(kw)
    return core.plan_env(**args)


def test_every_dotenv_variable_is_a_secret_but_gpuops_own():
    dotenv = {"HF_TOKEN": "hf-1", "WANDB_MODE": "offline", "WANDB_PROJECT": "proj", "EMPTY": "",
              "LAMBDA_API_KEY": "lk", "GPUOPS_PROFILE": "x", "WANDB_RUN_NAME": "mine"}
    p = plan(local_env=dotenv, dotenv_names=list(dotenv))
    assert p.secrets == {"HF_TOKEN": "hf-1", "WANDB_MODE": "offline", "WANDB_PROJECT": "proj", "EMPTY": "",
                         "WANDB_RUN_NAME": "mine"}
    assert all(p.secret_origin[n] == ".env" for n in p.secrets)
    assert "WANDB_RUN_NAME" not in p.exported  # the .env value over gpuops' default
    text = "\n".join(p.lines())
    assert "hf-1" not in text and "offline" not in text and "proj" not in text
    assert "WANDB_MODE=<secret, from .env>" in text and "LAMBDA_API_KEY" not in text and "GPUOPS_PROFILE" not in text


def test_a_dotenv_variable_the_profile_or_env_option_sets_takes_that_value():
    p = plan(local_env={"WANDB_MODE": "offline"}, dotenv_names=["WANDB_MODE"], cli_env={"WANDB_MODE": "online"})
    assert p.exported["WANDB_MODE"] == "online" and "WANDB_MODE" not in p.secrets


@pytest.mark.parametrize("name", ["HF_TOKEN", "OPENAI_API_KEY", "aws_secret_access_key", "DB_PASSWORD",
                                  "GOOGLE_APPLICATION_CREDENTIALS", "WANDB_API_KEY", "hf_token"])
def test_names_that_look_secret_given_with_env_are_secrets(name):
    assert core.looks_secret(name)
    p = plan(cli_env={name: "v-123"}, profile_env={"PLAIN": "1"})
    assert p.secrets[name] == "v-123" and name not in p.exported and p.exported["PLAIN"] == "1"
    assert "v-123" not in "\n".join(p.lines())
    assert core.recordable_env({name: "v-123", "PLAIN": "1"}) == {"PLAIN": "1"}


@pytest.mark.parametrize("name", ["WANDB_MODE", "NCCL_DEBUG", "PYTORCH_CUDA_ALLOC_CONF", "GPUOPS_RESUME_FROM"])
def test_plain_names_stay_plain(name):
    assert not core.looks_secret(name)


def test_a_process_of_a_run_that_is_not_running_holds_the_gpu_as_any_other():
    from test_gate_unit import ADA0, ada

    apps = f"5002, 48900, {ADA0}, python3\n"
    procs = {"5002": {"pgid": 5002, "sid": 5002, "environ": True, "run_id": "train-20260101-000000"}}
    # the run is active: its child that left the session is the run's
    assert core.gpu_holders(ada(apps, procs), [], active_ids=["train-20260101-000000"]) == []
    # the run was stopped or ended: its leftover holds GPU 0, said with the stop that ends it
    got = core.gpu_holders(ada(apps, procs), [], active_ids=[])
    assert [p for p, _ in got] == ["GPU 0 holds 48900 MiB of process 5002 (python3), a process left over from gpuops "
                                   "run train-20260101-000000, which is not running (stop it: gpuops stop "
                                   "train-20260101-000000)"]

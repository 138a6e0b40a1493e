"""Issue #36: `.env` means what it means everywhere else (python-dotenv, the ecosystem's parser): a quoted value
with a comment after it, a multi-line quoted value (a PEM key, a JSON credential), and a warning naming a line it
cannot read. Then end to end: the job gets exactly those values."""
from __future__ import annotations

import hashlib
from pathlib import Path

from gpuops.profiles import model as profiles

PEM = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nbm90IGEgcmVhbCBrZXk=\n-----END PRIVATE KEY-----"
JSON_CRED = '{\n  "type": "service_account",\n  "private_key_id": "abc"\n}'
DOTENV = f"""# tokens
HF_TOKEN="hf_abc" # my token
export WANDB_API_KEY='wk_123'  # another
PLAIN=value # comment
HASH_INSIDE="a#b"
PEM_KEY="{PEM}"
GCP_JSON='{JSON_CRED}'
EMPTY=
"""


def test_dotenv_quotes_comments_and_multi_line_values(tmp_path):
    (tmp_path / ".env").write_text(DOTENV)
    got = profiles.read_dotenv(tmp_path / ".env")
    assert got["HF_TOKEN"] == "hf_abc"
    assert got["WANDB_API_KEY"] == "wk_123"
    assert got["PLAIN"] == "value"
    assert got["HASH_INSIDE"] == "a#b"
    assert got["PEM_KEY"] == PEM
    assert got["GCP_JSON"] == JSON_CRED
    assert got["EMPTY"] == ""
    assert profiles.dotenv_problems(tmp_path / ".env") == []


def test_a_line_it_cannot_read_is_named_never_its_value(tmp_path):
    dot = tmp_path / ".env"
    dot.write_text('GOOD=1\nthis line is not a variable\nBAD="unterminated secret-value-xyz\n')
    got = profiles.read_dotenv(dot)
    assert got.get("GOOD") == "1" and "BAD" not in got
    problems = profiles.dotenv_problems(dot)
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{dot}: line 2 cannot be read as NAME=VALUE")
    assert problems[1].startswith(f"{dot}: line 3 cannot be read as NAME=VALUE")
    assert all("left out" in p for p in problems)
    assert not any("secret-value-xyz" in p or "this line" in p for p in problems)


def test_a_name_that_is_no_variable_name_is_named(tmp_path):
    dot = tmp_path / ".env"
    dot.write_text("my.key=1\nOK=2\n")
    assert profiles.read_dotenv(dot) == {"OK": "2"}
    (p,) = profiles.dotenv_problems(dot)
    assert p.startswith(f"{dot}: line 1") and "my.key" in p and "not a variable name" in p


def test_the_job_gets_the_values_as_dotenv_reads_them(sandbox, gpuops, isolated):
    from support.runs import run_dir, run_id_of, wait_ended

    prof = Path(sandbox["profile"])
    prof.write_text(prof.read_text() + "secrets: [PEM_KEY, GCP_JSON]\n")
    (isolated / ".env").write_text(DOTENV + 'BROKEN="never closed\n')
    (isolated / ".env").chmod(0o600)
    # the job writes a digest of each value: the log never holds them
    (isolated / "job.sh").write_text("#!/bin/sh\nfor v in HF_TOKEN PEM_KEY GCP_JSON HASH_INSIDE; do\n"
                                     "  printf '%s=' \"$v\"; eval printf '%s' \"\\\"\\$$v\\\"\" | sha256sum | cut -c1-16\n"
                                     "done\n")
    r = gpuops("train", "--script", "job.sh", "--no-snapshot")
    rid = run_id_of(r)
    assert f"{isolated / '.env'}: line 15 cannot be read as NAME=VALUE" in r.err, r.err
    assert wait_ended(sandbox, rid) == 0
    log = (run_dir(sandbox, rid) / "log").read_text()
    for name, value in (("HF_TOKEN", "hf_abc"), ("PEM_KEY", PEM), ("GCP_JSON", JSON_CRED), ("HASH_INSIDE", "a#b")):
        assert f"{name}={hashlib.sha256(value.encode()).hexdigest()[:16]}" in log, (name, log)
    assert "hf_abc" not in r.all and "MIIEvQ" not in r.all


def test_run_says_it_before_anything_bills_and_once(isolated):
    import io

    from gpuops.console import Output
    from gpuops.pipeline import prelaunch

    (isolated / "train.py").write_text("print('hi')\n")
    (isolated / ".env").write_text('A=1\nB="open\n')
    out = Output(stdout=io.StringIO(), stderr=io.StringIO())
    prelaunch.check(isolated, "train.py", out)
    prelaunch.check(isolated, "train.py", out)  # the train stage reads .env again: said once
    err = out.stderr.getvalue()
    assert err.count("line 2 cannot be read as NAME=VALUE") == 1, err

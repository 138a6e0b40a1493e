"""Secrets in .env never travel as files: sync leaves every .env out, whatever the profile's exclusions say."""
import json
from pathlib import Path


def test_dotenv_is_never_synced_even_with_a_custom_exclude_list(sandbox, gpuops):
    here = Path.cwd()
    (here / "train.py").write_text("print('hi')\n")
    (here / ".env").write_text("WANDB_API_KEY=wandb_v1_secret\n")
    (here / "sub").mkdir()
    (here / "sub" / ".env").write_text("HF_TOKEN=hf_secret\n")
    (here / ".env.example").write_text("WANDB_API_KEY=\n")
    prof = sandbox["profile"]
    prof.write_text(prof.read_text() + "sync:\n  exclude: [checkpoints]\n")  # a list without .env
    r = gpuops("sync", "-p", "sandbox", "--json")
    assert r.code == 0, r.all
    remote = sandbox["dir"] / "home" / here.name
    assert (remote / "train.py").exists() and (remote / ".env.example").exists()
    assert not (remote / ".env").exists() and not (remote / "sub" / ".env").exists()
    assert "secret" not in json.dumps(json.loads(r.out))

"""A plain `gpuops sync` starts without typer and pydantic (cli/quick.py, profiles/memo.py: issue 42's sync ratio). What
must not change: what typer would have parsed, what a profile validates to, what the sync does and says. And what
must never happen: a profile edited since it was kept acting as it was, a secret of the environment in a file."""
from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.cli import main, quick
from gpuops.profiles import memo
from gpuops.profiles import model as profiles

# typer's parameter names as the sync body receives them (quick.parse gives the same keys)
PARAMS = ("delete", "dry_run", "exclude", "gitignore", "copy_links", "yes", "json_", "host")

PLAIN = [
    ["sync"], ["sync", "box"], ["sync", "-p", "box"], ["sync", "--profile", "box"], ["sync", "--profile=box"],
    ["sync", "box", "-p", "box"], ["sync", "--json"], ["sync", "-n", "--delete"], ["sync", "--dry-run", "-y"],
    ["sync", "-x", "data", "--exclude", "*.bin", "--exclude=logs/", "-x", "-weird"], ["sync", "--gitignore"],
    ["sync", "--copy-links"], ["sync", "--no-copy-links"], ["sync", "--copy-links", "--no-copy-links"],
    ["sync", "--host", "0"], ["sync", "--host=2", "--json", "box"], ["sync", "--yes", "--json", "-p", "box"],
]
NOT_PLAIN = [
    ["sync", "--help"], ["sync", "-h"], ["sync", "-ny"], ["sync", "--host", "x"], ["sync", "--host", "-1"],
    ["sync", "--host"], ["sync", "-p"], ["sync", "--delete=1"], ["sync", "a", "b"], ["sync", "--", "x"],
    ["sync", "--no-such"], ["sync", "-xdata"], ["sync", ""], ["fetch"], ["--version"], [], ["syncx"],
    ["sync", "--host", "\u0663"],
]


def typer_parse(args: list[str], monkeypatch) -> dict:
    """What typer gives the sync body for `args` (the body and the profile's resolution recorded, not run)."""
    got: dict = {}

    def body(pick, **kw):
        got.update(kw, picked=pick(None))
        return 0

    monkeypatch.setattr(quick, "sync", body)
    monkeypatch.setattr("gpuops.cli.transfer.pick_profile", lambda name, profile, out: (name, profile))
    main._app_for(args)(args=args, prog_name="gpuops", standalone_mode=False)
    return got


def test_a_plain_call_is_parsed_as_typer_parses_it(monkeypatch):
    for args in PLAIN:
        mine = quick.parse(args)
        assert mine is not None, args
        theirs = typer_parse(args, monkeypatch)
        assert theirs["picked"] == (mine["name"], mine["profile"]), args
        assert {k: (theirs[k] or []) if k == "exclude" else theirs[k] for k in PARAMS} == {k: mine[k] for k in PARAMS}, \
            args


def test_anything_else_is_left_to_typer():
    for args in NOT_PLAIN:
        assert quick.parse(args) is None, args
    assert quick.take(["sync", "--help"]) is None


def _same(kept, model) -> None:
    """Every field of the model, nested models included, read the same from the kept View."""
    fields = type(model).model_fields
    assert kept.model_fields_set == model.model_fields_set
    for name in fields:
        a, b = getattr(kept, name), getattr(model, name)
        if hasattr(type(b), "model_fields"):
            _same(a, b)
        elif isinstance(b, list) and b and hasattr(type(b[0]), "model_fields"):
            assert len(a) == len(b)
            for x, y in zip(a, b):
                _same(x, y)
        else:
            assert a == b and type(a) is type(b), (name, a, b)


def _profile(tmp_path: Path, name: str, text: str) -> Path:
    d = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.yaml"
    p.write_text(text)
    return p


MANAGED = """host: 127.0.0.1
port: 2222
key: ~/.ssh/id_ed25519
price_per_hour: 2.49
host_key: ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl
cloud:
  provider: lambda
  instance_id: inst-1
  launch_id: launch-1
  launched_at: "2026-12-07T01:00:00+00:00"
  ttl_deadline: "2026-12-07T05:00:00+00:00"
  idle_limit_s: 1800
  filesystems: [{name: work, id: fs-1, mount_point: /lambda/nfs/work}]
sync:
  exclude: [data, "*.bin"]
  copy_links: true
"""
SLURM = """host: login.cluster
user: me
slurm: {partition: gpu, nodes: 2, gpus_per_node: 8, exclude: [n3]}
expect: {gpu: H100, gpu_count: 8, packages: {torch: ">=2.4"}}
env: {NCCL_DEBUG: WARN}
fetch: {checkpoints: ckpt}
"""


@pytest.mark.parametrize("text", [MANAGED, SLURM, "host: 10.0.0.5\nremote_dir: ~/work/proj\n"])
def test_a_kept_profile_reads_as_the_model_validated_it(tmp_path, text):
    p = _profile(tmp_path, "box", text)
    prof = profiles.load_profile(p, Path.cwd())
    kept = memo.recall(p, Path.cwd())
    assert kept is not None
    _same(kept, prof)
    for derived in ("address", "destination", "is_fleet", "rank"):
        assert getattr(kept, derived) == getattr(prof, derived), derived
    assert kept.remote_dir_for(Path.cwd()) == prof.remote_dir_for(Path.cwd())
    assert kept.node(None) is kept and kept.nodes() == [kept]
    if prof.cloud:
        assert kept.cloud.instance_ids == prof.cloud.instance_ids
    with pytest.raises(Exception) as theirs:
        prof.node(1)
    with pytest.raises(Exception) as mine:
        kept.node(1)
    assert str(mine.value) == str(theirs.value)
    # the owner's only
    f = memo._memo_file(p)
    assert stat.S_IMODE(f.stat().st_mode) == 0o600


def test_a_change_to_what_validation_read_is_validated_again(tmp_path, monkeypatch):
    p = _profile(tmp_path, "box", "host: ${BOX_IP:-10.0.0.5}\n")
    profiles.load_profile(p, Path.cwd())
    assert memo.recall(p, Path.cwd()).host == "10.0.0.5"
    monkeypatch.setenv("BOX_IP", "10.0.0.9")  # the variable the profile reads
    assert memo.recall(p, Path.cwd()) is None
    monkeypatch.delenv("BOX_IP")
    (Path.cwd() / ".env").write_text("BOX_IP=10.0.0.7\n")  # the same, from the project's .env
    assert memo.recall(p, Path.cwd()) is None
    assert profiles.load_profile(p, Path.cwd()).host == "10.0.0.7"
    assert memo.recall(p, Path.cwd()).host == "10.0.0.7"
    p.write_text("host: 10.0.0.5\nport: 2022\n")  # the text
    assert memo.recall(p, Path.cwd()) is None
    profiles.load_profile(p, Path.cwd())
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))  # `~` in key: means another folder now
    assert memo.recall(p, Path.cwd()) is None
    monkeypatch.setattr("gpuops.__version__", "0.0.0-other")  # another gpuops
    assert memo.recall(p, Path.cwd()) is None


def test_no_secret_of_the_environment_reaches_a_file_and_no_fleet_is_kept(tmp_path, monkeypatch):
    secret = "xoxb-0000-quick-sync-secret"
    monkeypatch.setenv("HOOK", "https://hooks.example.invalid/" + secret)
    monkeypatch.setenv("TOKEN", secret)
    shapes = {"hook": "host: 10.0.0.5\nnotify_url: ${HOOK}\n", "envvar": "host: 10.0.0.5\nenv: {T: '${TOKEN}'}\n",
              "index": "host: 10.0.0.5\nsetup: {index_url: 'https://u:${TOKEN}@pypi.example.invalid/simple'}\n",
              "fleet": "hosts: [10.0.0.5, 10.0.0.6]\n"}
    for name, text in shapes.items():
        p = _profile(tmp_path, name, text)
        profiles.load_profile(p, Path.cwd())
        assert memo.recall(p, Path.cwd()) is None, name
        assert not memo._memo_file(p).exists(), name
    from gpuops.paths import state_dir

    # what gpuops wrote: the kept profiles' folder, and everything under this test's own folder (config, home)
    for root in (state_dir() / "profile-memo", tmp_path):
        for f in root.rglob("*"):
            if f.is_file() and f.stat().st_size < 1 << 20:
                assert secret.encode() not in f.read_bytes(), f


def _started_without(sandbox, *args: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`gpuops sync ...` as its own process; which of typer, pydantic and yaml it imported."""
    code = ("import sys; from gpuops.cli.main import run; code = run(sys.argv[1:]); "
            "print('imported:', *(m for m in ('typer', 'pydantic', 'yaml', 'paramiko', 'tenacity') if m in sys.modules), "
            "file=sys.stderr); sys.exit(code)")
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=os.environ.copy())
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("imported:"), r.stderr
    r.stderr = r.stderr.strip().rsplit("\n", 1)[0]
    return r, last.split()[1:]


def _doc(r: subprocess.CompletedProcess) -> dict:
    doc = json.loads(r.stdout)
    for k in ("duration_s", "bytes_sent", "attempts"):  # a first contact: rsync again once its key is trusted
        doc.pop(k)
    return doc


def test_a_resync_starts_without_typer_and_pydantic_and_does_the_same(sandbox):
    here = Path.cwd()
    (here / "train.py").write_text("print('hi')\n")
    (here / "data").mkdir()
    (here / "data" / "big.bin").write_bytes(b"x" * 1000)
    first, imported = _started_without(sandbox, "sync", "-p", "sandbox", "--json")
    assert first.returncode == 0, first.stderr
    assert "pydantic" in imported and "typer" in imported  # validated: and kept
    again, imported = _started_without(sandbox, "sync", "-p", "sandbox", "--json")
    assert again.returncode == 0, again.stderr
    assert imported == [], again.stderr
    assert again.stderr.splitlines()[0] == "profile: sandbox (given)"  # the first made it this project's default
    assert _doc(again) == {**_doc(first), "files": 0, "changes": []}
    # the profile edited: validated again, and what it says now is done (data/ left out of a dry run's listing)
    prof = sandbox["profile"]
    prof.write_text(prof.read_text() + "sync:\n  exclude: [data]\n")
    (here / "data" / "new.bin").write_bytes(b"y")
    (here / "new.py").write_text("x = 1\n")
    edited, imported = _started_without(sandbox, "sync", "-p", "sandbox", "--json")
    assert edited.returncode == 0 and "pydantic" in imported, edited.stderr
    assert [c["path"] for c in json.loads(edited.stdout)["changes"] if c["kind"] == "file"] == ["new.py"]
    # an edit that does not validate is refused in the model's words, never synced as it was kept
    prof.write_text(prof.read_text().replace("port:", "port: 99999\nold_port:"))
    bad, imported = _started_without(sandbox, "sync", "-p", "sandbox", "--json")
    assert bad.returncode == 2 and "pydantic" in imported
    assert "port" in bad.stderr and "profile: sandbox" not in bad.stderr


def test_the_usual_start_and_the_quick_one_say_the_same(sandbox, gpuops, monkeypatch):
    (Path.cwd() / "a.py").write_text("a = 1\n")
    assert gpuops("sync", "-p", "sandbox").code == 0  # the first call's own words said (a key trusted, a default)
    assert memo.recall(sandbox["profile"], Path.cwd()) is not None
    for args in (["sync", "-p", "sandbox", "--dry-run"], ["sync", "sandbox", "--host", "1"],
                 ["sync", "sandbox", "-p", "other"], ["sync", "-p", "sandbox", "-n", "--delete", "--json"]):
        quick_said = gpuops(*args)
        with monkeypatch.context() as m:
            m.setattr(quick, "take", lambda a: None)
            usual = gpuops(*args)
        assert (quick_said.code, quick_said.err) == (usual.code, usual.err), args
        if "--json" in args:
            assert {**json.loads(quick_said.out), "duration_s": 0} == {**json.loads(usual.out), "duration_s": 0}
        else:
            assert quick_said.out == usual.out, args


def test_a_managed_profile_past_its_ttl_is_warned_the_same_by_both_starts(sandbox, gpuops, monkeypatch):
    """The TTL's warning reads the kept profile's cloud block (datetimes) and the ledger, as the model's does."""
    from support.cloud import managed_profile

    (Path.cwd() / "a.py").write_text("a = 1\n")
    managed_profile(sandbox, "box", ttl_in=-60.0)
    assert gpuops("sync", "-p", "box").code == 0  # validated and kept; a first contact said
    assert memo.recall(sandbox["profile"].parent / "box.yaml", Path.cwd()) is not None
    quick_said = gpuops("sync", "-p", "box", "--json")
    with monkeypatch.context() as m:
        m.setattr(quick, "take", lambda a: None)
        usual = gpuops("sync", "-p", "box", "--json")
    assert "TTL passed" in quick_said.err, quick_said.err

    def timeless(text):  # the TTL passed a second longer ago for the second call
        return re.sub(r"\d+m\d+s ago", "ago", str(text))

    assert (quick_said.code, timeless(quick_said.err)) == (usual.code, timeless(usual.err))
    assert timeless(json.loads(quick_said.out)["warnings"]) == timeless(json.loads(usual.out)["warnings"])

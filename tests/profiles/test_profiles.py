"""Profiles: validation messages, ${VAR} and .env, lookup order and selection."""
import json
import os
from pathlib import Path

import pytest

from gpuops.profiles import model as profiles
from gpuops.errors import ProfileError


def write(dir_: Path, name: str, text: str) -> Path:
    dir_.mkdir(parents=True, exist_ok=True)
    p = dir_ / f"{name}.yaml"
    p.write_text(text)
    return p


def test_defaults_and_key_expansion(isolated):
    write(isolated / "profiles", "box", "host: 10.0.0.5\nkey: ~/.ssh/id\n")
    p = profiles.resolve("box")
    assert p.user == "ubuntu" and p.port == 22 and p.python == "python3" and p.host_key_policy == "accept-new"
    assert p.key == Path(os.environ["HOME"]) / ".ssh/id"
    assert p.remote_dir_for(isolated) == f"~/{isolated.name}"
    assert ".git" in p.sync.exclude and p.fetch == {"checkpoints": "checkpoints"}


def test_unknown_key_names_file_key_and_suggestion(isolated):
    f = write(isolated / "profiles", "box", "host: h\nexpect:\n  gpu_cont: 1\n")
    with pytest.raises(ProfileError) as e:
        profiles.resolve("box")
    assert str(f) in e.value.message and "expect.gpu_cont: unknown key" in e.value.message
    assert "did you mean 'gpu_count'" in e.value.message


def test_wrong_type_and_missing_host(isolated):
    write(isolated / "profiles", "a", "host: h\nport: twenty\n")
    with pytest.raises(ProfileError, match="port: .*got 'twenty'"):
        profiles.resolve("a")
    write(isolated / "profiles", "b", "user: ubuntu\n")
    with pytest.raises(ProfileError, match="host: required key is missing"):
        profiles.resolve("b")
    write(isolated / "profiles", "c", "host: h\nhost_key_policy: off\n")
    with pytest.raises(ProfileError, match="host_key_policy"):
        profiles.resolve("c")


def test_bad_yaml_names_line(isolated):
    write(isolated / "profiles", "y", "host: h\nexpect: [\n")
    with pytest.raises(ProfileError, match=r"not valid YAML at line \d+"):
        profiles.resolve("y")


def test_env_vars_from_environment_and_dotenv(isolated, monkeypatch):
    (isolated / ".env").write_text("export BOX_IP='1.2.3.4'\n# comment\nBOX_KEY=~/k # trailing\n")
    write(isolated / "profiles", "box", "host: ${BOX_IP}\nkey: ${BOX_KEY}\nregion: ${REGION:-us-west-3}\n")
    p = profiles.resolve("box")
    assert p.host == "1.2.3.4" and p.key.name == "k" and p.region == "us-west-3"
    monkeypatch.setenv("BOX_IP", "5.6.7.8")  # the real environment wins over .env
    assert profiles.resolve("box").host == "5.6.7.8"


def test_unset_variable_is_a_clear_error(isolated):
    write(isolated / "profiles", "box", "host: ${NOPE_NOT_SET}\n")
    with pytest.raises(ProfileError, match=r"host: \$\{NOPE_NOT_SET\} is not set"):
        profiles.resolve("box")


def test_selection_chain(isolated, monkeypatch):
    write(isolated / "profiles", "one", "host: a\n")
    assert profiles.resolve(None).name == "one"  # the only one
    write(isolated / "profiles", "two", "host: b\n")
    with pytest.raises(ProfileError, match="which profile\\? found 2: one, two"):
        profiles.resolve(None)
    profiles.remember(profiles.resolve("two"), isolated)
    assert profiles.resolve(None).name == "two"  # last used here
    monkeypatch.setenv("GPUOPS_PROFILE", "one")
    assert profiles.resolve(None).name == "one"  # env beats last used
    assert profiles.resolve("two").name == "two"  # explicit beats env


def test_lookup_order_project_then_user_then_packaged(isolated):
    user_dir = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles"
    write(user_dir, "lambda-h100", "host: user-level\n")
    assert profiles.resolve("lambda-h100").host == "user-level"
    write(isolated / "profiles", "lambda-h100", "host: project-level\n")
    assert profiles.resolve("lambda-h100").host == "project-level"


def test_packaged_examples_load(isolated):
    p = profiles.resolve("lambda-h100")
    assert p.instance_type == "gpu_1x_h100_pcie" and p.expect.driver == "570.148.08" and p.expect.cuda == "12.8"
    assert p.expect.packages["torch"] == "2.9.0" and p.env_preset == "h100"
    assert p.sync.exclude == [".git", "checkpoints", "outputs", "wandb", "__pycache__", "*.pyc"]
    ada = profiles.resolve("rtx6000ada-workstation")
    assert ada.expect.gpu_count == 2 and ada.host_key_policy == "strict"


def test_unknown_profile_suggests(isolated):
    write(isolated / "profiles", "lambda-h100", "host: a\n")
    with pytest.raises(ProfileError, match="did you mean 'lambda-h100'"):
        profiles.resolve("lambda-h10")


def test_shell_path_quotes_but_keeps_home():
    assert profiles.shell_path("~/my proj") == "\"$HOME\"/'my proj'"
    assert profiles.shell_path("/data/x;rm -rf /") == "'/data/x;rm -rf /'"
    assert profiles.shell_path("~") == '"$HOME"'


def test_profiles_command_lists_and_masks_secrets(isolated, gpuops, monkeypatch):
    write(isolated / "profiles", "box", "host: h\nenv:\n  HF_TOKEN: ${HF_TOKEN}\n  EPOCHS: '3'\nsecrets: [MY_PASS]\n")
    monkeypatch.setenv("HF_TOKEN", "hf_supersecretvalue")
    r = gpuops("profiles")
    assert r.code == 0 and "box" in r.out and "lambda-h100" in r.out and "(example)" in r.out
    r = gpuops("profiles", "show", "box")
    assert r.code == 0 and "hf_supersecretvalue" not in r.all and "HF_TOKEN: '***'" in r.out and "EPOCHS: '3'" in r.out
    r = gpuops("profiles", "show", "nope")
    assert r.code == 2 and "no profile named 'nope'" in r.err


def test_shell_command_keeps_home_and_quotes_words():
    assert profiles.shell_command("~/venv/bin/python -X dev") == "\"$HOME\"/venv/bin/python -X dev"
    assert profiles.shell_command("'/opt/py thon/bin/python' -c 'a;b'") == "'/opt/py thon/bin/python' -c 'a;b'"
    assert profiles.shell_command("python3") == "python3"


def test_profiles_of_terminated_instances_do_not_pile_up_in_the_list(isolated, gpuops, tmp_path):
    """Issue #28: every `gpuops run` writes a run-* profile, kept (cloud.state: gone) once its instance is
    terminated; the list showed them all. Hidden unless --all, and counted with how to see them."""
    user = tmp_path / "config" / "profiles"
    for i in range(3):
        write(user, f"run-train-2026112{i}", "host: 127.0.0.9\ncloud:\n  provider: lambda\n  instance_id: i%d\n"
                                             "  state: gone\n" % i)
    write(user, "run-live", "host: 127.0.0.8\ncloud:\n  provider: lambda\n  instance_id: live\n")
    r = gpuops("profiles")
    assert r.code == 0, r.all
    assert "run-live" in r.out and "run-train-2026112" not in r.out
    assert "3 profiles of terminated instances not shown: gpuops profiles --all" in r.all
    rows = json.loads(gpuops("profiles", "--json").out)
    assert "run-live" in [x["name"] for x in rows] and not [x for x in rows if x["name"].startswith("run-train")]
    r = gpuops("profiles", "--all")
    assert r.code == 0 and r.out.count("terminated)") == 3
    rows = json.loads(gpuops("profiles", "--all", "--json").out)
    assert sorted(x["name"] for x in rows if x["terminated"]) == [f"run-train-2026112{i}" for i in range(3)]

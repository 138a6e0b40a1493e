"""Loading playbooks/ (knowledge.py): PyYAML's C loader where this PyYAML has it (issue #23: the pure-Python loader
cost verify 0.04-0.10 s), reading every playbook exactly as the pure-Python loader does, and a broken playbook still
one clear message with its line."""
from pathlib import Path

import pytest
import yaml

from gpuops import knowledge
from gpuops.errors import UsageError
from gpuops.paths import data_dir


def test_the_c_loader_is_used_where_pyyaml_has_it():
    assert yaml.__with_libyaml__, "this PyYAML was built without libyaml: the fast path is not exercised here"
    assert knowledge.yaml_loader() is yaml.CSafeLoader


@pytest.mark.parametrize("path", sorted(data_dir("playbooks").glob("*.yaml")), ids=lambda p: p.name)
def test_every_playbook_reads_the_same_through_both_loaders(path):
    text = path.read_text(encoding="utf-8")
    assert yaml.load(text, Loader=yaml.CSafeLoader) == yaml.load(text, Loader=yaml.SafeLoader)
    knowledge._load.cache_clear()
    assert knowledge.load_playbook(path.stem, Path("/nonexistent")) == yaml.safe_load(text)


def test_a_broken_playbook_is_one_message_with_its_line(tmp_path):
    bad = tmp_path / "verify.yaml"
    bad.write_text("checks:\n  - gpu.model\n  thresholds: [\n")
    with pytest.raises(UsageError) as exc:
        knowledge.load_playbook("verify", path=str(bad))
    assert str(exc.value).endswith("verify.yaml: not valid YAML at line 3, column 3: did not find expected '-' indicator")
    bad.write_text("- a list\n")
    with pytest.raises(UsageError, match="expected a mapping at the top level"):
        knowledge.load_playbook("verify", path=str(bad))

"""What every check reads (pure): the facts, the profile and its expect:, the playbook and its thresholds, the
knowledge, the presets; and how to install into the profile's python there."""
from __future__ import annotations

from .facts import Facts


class Context:
    def __init__(self, facts: Facts, profile, playbook: dict, knowledge: dict, presets: dict, preset_env: dict):
        self.f = facts
        self.p = profile
        self.e = profile.expect
        self.pb = playbook
        self.th = playbook.get("thresholds", {}) or {}
        self.k = knowledge
        self.presets = presets
        self.preset_env = preset_env

    @property
    def gpu_host(self) -> bool:
        return self.f.smi.state == "ok" and bool(self.f.gpus)

    def installed(self, name: str) -> str | None:
        return self.f.packages.get(name)

    @property
    def pip_install(self) -> str:
        """How to install into the profile's python, runnable there: its pip, or uv's pip for an environment uv made
        without pip (the probe says which it has)."""
        return _installer(self.f, self.p.python, "install")

    @property
    def pip_uninstall(self) -> str:
        return _installer(self.f, self.p.python, "uninstall")


def _installer(facts: Facts, python: str, verb: str) -> str:
    py = facts.python or {}
    if py.get("pip") is False and py.get("uv"):
        return f"uv pip {verb} --python {python}"
    return f"{python} -m pip {verb}" + (" -y" if verb == "uninstall" else "")

"""Which profiles are leftovers (pure): a profile whose instance was terminated, and a `run-*` profile (`gpuops run`
writes one per run). `gpuops profiles` marks them; `gpuops profiles prune` removes the prunable ones, never the
profile of a live instance."""
from __future__ import annotations

from dataclasses import dataclass

RUN_PREFIX = "run-"  # pipeline.runner names a run's instance profile run-<run id>
ENDED = ("terminated", "failed")  # the ledger's closed states (cloud.ledger: a failed launch created nothing)


@dataclass(frozen=True)
class Mark:
    text: str | None  # what `gpuops profiles` shows after the name, or None
    prunable: bool  # `gpuops profiles prune` may remove it
    live: bool  # an instance behind it may still run (and bill)


def mark(name: str, cloud, ledger_states: dict[str, str]) -> Mark:
    """name: the profile's; cloud: its `cloud:` block (None for a hand-written profile); ledger_states: instance id ->
    the ledger's state for the instances this machine launched. An instance without a record here (launched from
    another machine) counts as live unless the profile says it is gone."""
    run = name.startswith(RUN_PREFIX)
    if cloud is None:
        return Mark("run" if run else None, run, False)
    states = [ledger_states.get(i) for i in cloud.instance_ids]
    if any(s is not None and s not in ENDED for s in states):
        return Mark("run, instance live" if run else None, False, True)
    if cloud.state == "gone" or (states and all(s in ENDED for s in states)):
        return Mark("run, instance terminated" if run else "instance terminated", True, False)
    return Mark("run, instance live" if run else None, False, True)

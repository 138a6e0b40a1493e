"""The Lambda API emulator's side of a test (the fixtures `cloud_emu` and `cloud` are in tests/conftest.py)."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import yaml

from gpuops.cloud.ledger import LAUNCHED, Ledger, Record


API_KEY = "sk_e2e_" + "Zx9" * 8  # a key no output or file may contain
TYPE = "gpu_1x_h100_pcie"


def cloud_up(gpuops, cloud, name, *extra):
    """`gpuops up NAME --type TYPE --key <the test's key> --yes ...extra`."""
    return gpuops("up", name, "--type", TYPE, "--key", str(cloud.key), "--yes", *extra)


def live_instances(cloud):
    """The emulator's instances that are neither terminated nor terminating."""
    return [i for i in cloud.instances() if i["status"] not in ("terminated", "terminating")]


def managed_profile(sandbox, name: str, *, ttl_in: float | None, idle: float | None = None,
                    launched_ago: float = 3600.0, state: str = "active") -> dict:
    """A profile `name` as `gpuops up` writes it (a `cloud:` block, its TTL and idle limit) for the sandbox host, and its
    instance's record in the ledger."""
    doc = yaml.safe_load(sandbox["profile"].read_text())
    now = datetime.now(timezone.utc)
    doc["price_per_hour"] = 2.49
    doc["cloud"] = {"provider": "lambda", "instance_id": f"inst-{name}", "launch_id": f"launch-{name}",
                    "launched_at": (now - timedelta(seconds=launched_ago)).isoformat(),
                    "ttl_deadline": (now + timedelta(seconds=ttl_in)).isoformat() if ttl_in is not None else None,
                    "idle_limit_s": idle, "state": state}
    (sandbox["profile"].parent / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    Ledger().add(Record(launch_id=f"launch-{name}", profile=name, instance_type="gpu_1x_h100_pcie", region="us-east-1",
                        price_cents_per_hour=249, created_at=time.time() - launched_ago, state=LAUNCHED,
                        instance_id=f"inst-{name}", launched_at=time.time() - launched_ago, idle_limit_s=idle))
    return doc

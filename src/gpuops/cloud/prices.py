"""An instance type's hourly price for a profile (`gpuops profiles new --type`): Lambda's API listing when an API key
is available, else playbooks/prices.yaml (the public price list). The talking part is one GET /instance-types."""
from __future__ import annotations

from pathlib import Path

from ..errors import GpuopsError


def table_price(instance_type: str, project_dir: Path | None = None) -> tuple[float | None, str]:
    """(price, source) from playbooks/prices.yaml; (None, "") for a type it lacks. Pure over the table."""
    from ..knowledge import load_playbook

    doc = load_playbook("prices", project_dir)
    price = (doc.get("prices") or {}).get(instance_type)
    return (float(price), str(doc.get("source") or "playbooks/prices.yaml")) if price is not None else (None, "")


def listed_price(instance_type: str, project_dir: Path | None = None, warn=lambda text: None) -> tuple[float | None, str]:
    """(price per hour, where it came from). The API's listing when a key is found (one request, a short timeout);
    a missing key is no error (the table answers), an API that fails is said through `warn` and the table answers."""
    from .credentials import base_url, load_api_key

    try:
        key, _ = load_api_key(project_dir)
    except GpuopsError:
        return table_price(instance_type, project_dir)
    from .api import Client

    try:
        client = Client(key, base_url(), timeout=10.0, connect_timeout=5.0, attempts=2)
        try:
            listing = client.instance_types()
        finally:
            client.close()
    except GpuopsError as exc:
        warn(f"price of {instance_type}: Lambda's API did not answer ({exc.message}); using the price list")
        return table_price(instance_type, project_dir)
    t = listing.get(instance_type)
    if t is not None and t.type.price_cents_per_hour > 0:
        return t.type.price_per_hour, "Lambda's API listing"
    return table_price(instance_type, project_dir)

"""Why a stage of `gpuops run` stops early (the exceptions the Runner's stages raise and its loop judges): the
budget reached (--max-cost), the instance lost (the API says it ended under the run), the connection given up."""
from __future__ import annotations

from ..errors import GpuopsError


class BudgetReached(Exception):
    """Raised from watch's event callback (or up's wait hook) when --max-cost is reached."""

    def __init__(self, reason: str = "--max-cost reached"):
        super().__init__(reason)
        self.reason = reason


class InstanceLost(Exception):
    """The API says an instance of the run ended (terminated, terminating, preempted) or is unhealthy."""

    def __init__(self, instance_id: str, status: str):
        super().__init__(f"instance {instance_id} is {status}")
        self.instance_id, self.status = instance_id, status


class _ConnectionGaveUp(Exception):
    """The instance cannot be reached, and the API does not say it ended: the run is left to resume."""

    def __init__(self, error: GpuopsError):
        super().__init__(error.message)
        self.error = error

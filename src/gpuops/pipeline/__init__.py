"""`gpuops run`: one command from nothing to verified checkpoints, paying only for the minutes that train.

- stages: the stages in order, the local record that makes a run resumable, what was spent (pure).
- money: a run's TTL and what may be said of an instance it could not terminate (pure).
- runner: each stage run against the cloud and the host (up, sync, setup, train, watch, fetch, down).
"""

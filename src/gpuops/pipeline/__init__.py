"""`gpuops run`: one command from nothing to verified checkpoints, paying only for the minutes that train.

- stages: the stages in order, the local record that makes a run resumable, what was spent (pure).
- runner: each stage run against the cloud and the host (up, sync, setup, train, watch, fetch, down).
"""

"""A local Lambda Cloud API emulator (`gpuops sandbox up --cloud`): server.py (the API and its knobs), daemon.py
(run it in the background across processes), catalog.py (instance types, regions, images)."""

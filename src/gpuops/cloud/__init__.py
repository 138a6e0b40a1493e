"""Lambda Cloud: the API client (api.py), the local launch ledger (ledger.py), pure decisions (decisions.py) and an
instance's lifecycle: what its steps share (instances.py: Context, UpSpec, terminating), the sequences up.py,
down.py, reap.py (ls and reap), and their parts launch.py (the launch requests), keys.py, managed.py (the profiles up
writes), watchdog.py (--guard on-instance). Imported only inside the cloud commands (httpx is heavy-ish)."""

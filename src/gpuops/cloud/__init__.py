"""Lambda Cloud: the API client (api.py), the local launch ledger (ledger.py), pure decisions (decisions.py) and the
lifecycle sequences up / down / reap (instances.py). Imported only inside the cloud commands (httpx is heavy-ish)."""

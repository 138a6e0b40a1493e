"""Moving files: plan (rsync arguments, filters, parsing, verification; pure), ops (sync and fetch, the talking part), snapshot (the environment snapshot of a run)."""

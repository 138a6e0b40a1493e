"""Metrics that outlive a page: one embedded SQLite database per project (runs/metrics.sqlite).

store (the schema and its versions, the writer with its one-writer-per-run lease, the queries and the thinning that
keeps extremes; stdlib only). What writes it is whatever follows a run (jobs.history, on the follow path that `gpuops
run`, `gpuops watch` and the dashboard all take); the dashboard reads it. Imports nothing.
"""

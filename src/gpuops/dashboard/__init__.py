"""`gpuops dashboard`: a local web page of the account's instances, the project's runs and each run's live GPUs, loss
and log. views (pure: the pages' data over the ledger/API rows, the run registry and the watch stream's events) ·
hub (talking: one follower per run through jobs.actions.follow, the API poller) · app (Starlette + uvicorn, the
token gate) · static/ (the page, and uPlot vendored: see static/VENDORED.md). Imports nothing."""

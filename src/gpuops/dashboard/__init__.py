"""`gpuops dashboard`: a local web page of the account's instances, the project's runs and each run's page (what it
is, its history by step, its GPUs, its log), and runs compared. views (pure: the overview's rows, what a run is) ·
feed (pure: a run's live feed, its chart layout, its history from the metrics database merged under it) · hub
(talking: one follower per run through jobs.actions.follow, the API poller) · app (Starlette + uvicorn, the token
gate) · static/ (the pages, and uPlot vendored: see static/VENDORED.md). Imports nothing."""

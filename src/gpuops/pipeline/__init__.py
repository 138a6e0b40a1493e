"""`gpuops run`, the one-command pipeline: stages (pure: order, spend, the record) and runner (the stages run against the cloud and the host)."""

"""Profiles: one YAML file per host (or fleet), validated.

- model: the pydantic model, lookup and selection, `.env` and ${VAR}, shell quoting of remote paths (pure but for
  reading profile files).
- text: a profile rendered from values, a gpus.yaml row or a host's facts (pure).
- write: `gpuops profiles new` / `pin`, the talking part (one connection, one probe, an atomic write).
"""

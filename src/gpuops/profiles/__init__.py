"""Profiles: the model (pydantic, lookup, selection), text (a profile rendered from values or facts) and write (`profiles new` / `pin`, the talking part)."""

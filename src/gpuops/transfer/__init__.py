"""Moving files between this machine and a host.

- plan: rsync arguments, filters, output parsing, checkpoint step selection, verification (pure).
- rsync: runs rsync (an argument list) with live progress, retries transient failures, classifies errors.
- sync: `gpuops sync` (one remote execution, then rsync). fetch: `gpuops fetch` (staged, hashed on both sides,
  promoted only when all verified). progress: rsync's progress on screen.
- snapshot: a run's environment snapshot (pip freeze, versions), its diff and the matrix.
"""

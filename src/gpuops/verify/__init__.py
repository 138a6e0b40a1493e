"""Is the host's GPU stack what the profile expects? One remote execution gathers the facts; the rest is pure.

- facts: the probe's document and tool output parsed (nvidia-smi, health, Xid).
- results: a check's outcome (CheckResult, the statuses) and the version rules every judge shares.
- checks, rules (knowledge as data: playbooks/rules.yaml), bench (`--bench` figures against the GPU table): the
  judgement, pure.
- gpus: the GPU table (playbooks/gpus.yaml). report: the report rendered (rich or plain lines).
- host: one host's verify and a fleet's (the talking part: one connection, one probe execution each).
"""

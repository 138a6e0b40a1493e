"""`gpuops setup`: bring a host to the profile's stack.

- plan: host facts + profile + the project's dependency files + knowledge -> ordered steps, and the script that runs
  them (pure).
- scripts: the host's side: the facts script (one execution), the start bundle (setup.sh detached), the attach
  stream.
- apply: the steps on one connection: facts, plan, start or re-attach, stream, verify.
"""

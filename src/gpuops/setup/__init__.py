"""`gpuops setup`: plan (facts + profile + project files -> steps; pure), remote (the host's facts script, the start bundle, the attach stream), apply (the steps on one connection)."""

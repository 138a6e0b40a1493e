"""A job on a host: train (detached), watch, logs, status, stop.

Pure: plan (run ids, the environment, the preflight verdict, the launch gate, local run records; what a script
needs to import is gpuops.project's, read from the local project), launchers (torchrun and Ray command lines per node),
signals (training signals in a log). The talking part: scripts (the remote shell scripts: preflight, launch
bundle, state, tail, stop; one execution each), watch (the one stream and the dashboard model), history (what a
follower keeps in the project's metrics database), actions (each command's steps on one connection).
"""

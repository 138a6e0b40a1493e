"""The typer app with every command registered: importing a command module registers its commands on `app`. Keep
these modules light (typer only). main.py imports this only when typer is to parse the call (quick.py answers a
plain `gpuops sync` without it)."""
from __future__ import annotations

from .app import app  # noqa: F401
from . import verify as _verify  # noqa: F401
from . import sandbox as _sandbox  # noqa: F401
from . import trust as _trust  # noqa: F401
from . import profiles as _profiles  # noqa: F401
from . import transfer as _transfer  # noqa: F401  (sync, fetch)
from . import jobs as _jobs  # noqa: F401  (train, watch, logs, status, stop)
from . import snapshot as _snapshot  # noqa: F401  (snapshot, diff, matrix)
from . import cloud as _cloud  # noqa: F401  (cloud types|keys, up, ls, down, reap)
from . import setup as _setup  # noqa: F401  (setup)
from . import run as _run  # noqa: F401  (run)
from . import fs as _fs  # noqa: F401  (fs ls|create|rm)
from . import dashboard as _dashboard  # noqa: F401  (dashboard)
from . import ssh as _ssh  # noqa: F401  (ssh)
from . import plan as _plan  # noqa: F401  (plan)

"""Where gpuops keeps its files. Every location can be moved with an environment variable."""
from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def config_dir() -> Path:
    """User configuration: profiles/ and known_hosts. $GPUOPS_CONFIG_DIR, else $XDG_CONFIG_HOME/gpuops."""
    if os.environ.get("GPUOPS_CONFIG_DIR"):
        return Path(os.environ["GPUOPS_CONFIG_DIR"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "gpuops"


def state_dir() -> Path:
    """User state: the sandbox host, last-used profiles. $GPUOPS_STATE_DIR, else $XDG_STATE_HOME/gpuops."""
    if os.environ.get("GPUOPS_STATE_DIR"):
        return Path(os.environ["GPUOPS_STATE_DIR"]).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser() / "gpuops"


def known_hosts_file() -> Path:
    return config_dir() / "known_hosts"


def user_known_hosts_file() -> Path:
    return Path.home() / ".ssh" / "known_hosts"


def data_dir(name: str) -> Path:
    """Packaged data (profiles/, playbooks/): inside the wheel, or at the repository root in a checkout."""
    packaged = PACKAGE_DIR / "_data" / name
    if packaged.is_dir():
        return packaged
    return PACKAGE_DIR.parent.parent / name


def _tmp_name(path: Path) -> Path:
    """A temporary name beside `path`, unique per process and thread (a fleet writes from several threads)."""
    import threading

    return path.with_name(f".{path.name}.tmp{os.getpid()}-{threading.get_ident()}")


def write_private(path: Path, data: str | bytes) -> None:
    """Write a file readable by its owner only: created 0600 before any byte is written, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so it appears under its final name only when complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        tmp.write_bytes(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def loose_mode(path: Path) -> int | None:
    """The permission bits of a file group or others may read or write (a file holding a secret should not be), or
    None: private, or no such file."""
    import stat

    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        return None
    return mode if mode & 0o077 else None

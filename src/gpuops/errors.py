"""Exception types carrying exit codes. Caught once, at the CLI boundary (cli/main.py)."""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # checks failed, or the remote job failed
    USAGE = 2  # bad usage or bad profile
    CONNECTION = 3  # cannot connect, authenticate, or host key refused
    INTERRUPTED = 130


_COMMAND = ["gpuops"]  # the command running, as the user typed it ("gpuops sync"): cli/main.py sets it


def set_command(name: str) -> None:
    _COMMAND[0] = name


def command() -> str:
    """The command that runs, for a hint ("`gpuops sync` tried 3 times"); "gpuops" outside the CLI."""
    return _COMMAND[0]


class GpuopsError(Exception):
    """An error with one readable message, an optional hint and an exit code."""

    code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, hint: str | None = None, code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if code is not None:
            self.code = code


class UsageError(GpuopsError):
    code = ExitCode.USAGE


class ProfileError(UsageError):
    """A profile is missing, ambiguous or invalid."""


class ConnectError(GpuopsError):
    """The host cannot be reached (refused, timed out, DNS)."""

    code = ExitCode.CONNECTION


class AuthError(ConnectError):
    """The host refused our key, or the key file is unusable."""


class HostKeyError(ConnectError):
    """The host key is unknown under a strict policy, or has changed."""


class RemoteError(GpuopsError):
    """A remote command failed or timed out."""

    code = ExitCode.FAILED


class ChecksFailed(GpuopsError):
    code = ExitCode.FAILED

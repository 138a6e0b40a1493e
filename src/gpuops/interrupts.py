"""SIGTERM and SIGHUP end a command the way Ctrl-C does.

A closed terminal (SIGHUP), a dropped ssh session, `timeout`, `kill`, systemd and container runtimes (SIGTERM) would
otherwise kill gpuops on the spot, skipping the clean-up Ctrl-C gets (terminating what a bring-up launched, saving a
run's record). `as_interrupt()` turns the first of them into KeyboardInterrupt, so the one Ctrl-C path runs; later
ones are ignored while that clean-up runs (Ctrl-C itself keeps its own meaning). A signal already ignored (`nohup`)
stays ignored. After SIGHUP the terminal is gone:
the standard streams that were on it are pointed at /dev/null, so the clean-up's messages cannot fail on it.
Light (stdlib only): imported by the CLI modules.
"""
from __future__ import annotations

import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

SIGNALS = ("SIGTERM", "SIGHUP")
_received: list[str] = []  # names of the signals turned into KeyboardInterrupt by the current as_interrupt()


def received() -> Optional[str]:
    """The name of the signal (SIGTERM, SIGHUP) that interrupted the command, or None (Ctrl-C, or nothing)."""
    return _received[0] if _received else None


def _off_the_terminal() -> None:
    try:
        null = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                os.dup2(null, fd)
        except OSError:
            pass
    os.close(null)


def _handler(signum, frame) -> None:
    name = signal.Signals(signum).name
    if _received:  # already cleaning up after one: let it finish
        _received.append(name)
        return
    _received.append(name)
    if name == "SIGHUP":
        _off_the_terminal()
    raise KeyboardInterrupt(name)


@contextmanager
def as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {}
    for name in SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None:
            continue
        if signal.getsignal(sig) == signal.SIG_IGN:
            continue  # `nohup gpuops ...`: the user asked for the hangup to be ignored, and so it is
        before[sig] = signal.getsignal(sig)
        signal.signal(sig, _handler)
    _received.clear()
    try:
        yield
    finally:
        for sig, old in before.items():
            signal.signal(sig, old)

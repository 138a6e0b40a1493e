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

import _thread
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, Optional

SIGNALS = ("SIGTERM", "SIGHUP")
_received: list[str] = []  # names of the signals turned into KeyboardInterrupt by the current as_interrupt()
_inside: list[bool] = []  # one entry while an as_interrupt() is open


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


def _again_where_it_can_be_raised(unraisable) -> bool:
    """A KeyboardInterrupt the interpreter could not raise: the signal's handler ran inside a weakref callback, a
    `__del__` or the garbage collector (an import's module-lock callback, say), where exceptions are printed
    ("Exception ignored in ...") and dropped. The command would go on as if never signalled, and, SIGTERM's mark
    being set, ignore every SIGTERM after. The signal is sent again, from a thread of its own a moment later (sent
    from here, its handler would run at once, still where nothing can be raised): the main thread runs the handler
    at its next point where an exception can be raised. True when it was."""
    exc = unraisable.exc_value
    if not isinstance(exc, KeyboardInterrupt) or threading.current_thread() is not threading.main_thread():
        return False
    name = exc.args[0] if exc.args and exc.args[0] in SIGNALS else None
    if name is not None and _received == [name]:
        _received.clear()  # not cleaned up after yet: the handler raises it anew
        sig = getattr(signal, name)
    elif not exc.args and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        sig = signal.SIGINT  # Ctrl-C, dropped the same way
    else:
        return False

    def again() -> None:
        time.sleep(0.05)  # the main thread is out of the callback by then (if not, this comes round again)
        if _inside:  # a command that ended meanwhile has done its work: not killed after it by SIGTERM's default
            os.kill(os.getpid(), sig)

    _thread.start_new_thread(again, ())  # not threading.Thread: its start() waits, and the signal would land there
    return True


@contextmanager
def as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (once), and an interrupt that
    landed where it could not be raised is delivered again."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    hook_before = sys.unraisablehook

    def hook(unraisable) -> None:
        if not _again_where_it_can_be_raised(unraisable):
            hook_before(unraisable)

    sys.unraisablehook = hook
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
    _inside.append(True)
    try:
        yield
    finally:
        _inside.pop()
        for sig, old in before.items():
            signal.signal(sig, old)
        sys.unraisablehook = hook_before

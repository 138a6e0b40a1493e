"""A command's output is complete only when nothing is left to read once its end was seen
(remote.connection.output_complete), whatever the interleaving with paramiko's transport thread, which buffers the
output and then takes the EOF while the reader looks. The interleaving is forced on a real paramiko Channel: the
"transport" delivers everything at the moment the reader has just looked at a buffer (before: the output and its EOF
arriving then were taken as an empty, complete answer; `gpuops run` saved an empty log and said the run was not
found on its instance)."""
from __future__ import annotations

import paramiko
import pytest
from paramiko.message import Message

from gpuops.remote.connection import output_complete


class _Arriving(paramiko.Channel):
    """A channel whose output (stdout and stderr) and EOF all arrive right after the reader's look at `buffer`."""

    def __init__(self, buffer: str):
        super().__init__(0)
        self.buffer, self.pending = buffer, True

    def _deliver(self) -> None:
        self.pending = False
        self._feed(b"the log's last line\n")
        m = Message()
        m.add_int(1)  # SSH_EXTENDED_DATA_STDERR
        m.add_string(b"RUN id=r exists=1\n")
        m.rewind()
        self._feed_extended(m)
        self._handle_eof(Message())

    def recv_ready(self):
        ready = super().recv_ready()
        if self.pending and self.buffer == "stdout":
            self._deliver()
        return ready

    def recv_stderr_ready(self):
        ready = super().recv_stderr_ready()
        if self.pending and self.buffer == "stderr":
            self._deliver()
        return ready


@pytest.mark.parametrize("buffer", ["stdout", "stderr"])
def test_output_and_eof_arriving_between_the_looks_are_read_not_dropped(buffer):
    """The last buffer looked at: stderr, or stdout for a reader that does not read stderr (fetch's hashing)."""
    chan = _Arriving(buffer)
    complete = output_complete(chan, {}, stderr=buffer == "stderr")
    assert not complete, "the output that came with the EOF was taken as never sent"
    assert chan.recv(1024) == b"the log's last line\n"
    assert chan.recv_stderr(1024) == b"RUN id=r exists=1\n"
    assert output_complete(chan, {})


def test_a_channel_with_output_left_is_not_complete_and_without_is():
    chan = paramiko.Channel(0)
    chan._feed(b"x")
    chan._handle_eof(Message())
    assert not output_complete(chan, {})
    chan.recv(10)
    assert output_complete(chan, {})


class _Late(paramiko.Channel):
    """A loaded host's sshd: the command's exit status first, its output `late` seconds after, then the EOF."""

    def __init__(self, late: float):
        import threading

        super().__init__(0)
        self.exit_status, self.closed = 0, False
        self.status_event.set()
        threading.Timer(late, self._deliver).start()

    def _deliver(self) -> None:
        m = Message()
        m.add_int(1)  # SSH_EXTENDED_DATA_STDERR
        m.add_string(b"RUN id=r exists=1 pid=7 alive=0 rc=0 started=1 ended=2 size=9 stop=-\n")
        m.rewind()
        self._feed_extended(m)
        self._feed(b"last line\n")
        self._handle_eof(Message())

    def close(self):
        pass


class _Remote:
    def __init__(self, chan):
        self.chan = chan

    def stream(self, command):
        return self.chan


def test_a_state_line_later_than_the_grace_is_waited_for(monkeypatch):
    """`gpuops run`'s final log fetch said `run X not found` on the run's own instance, the instance kept billing:
    the exit status came, then nothing for EOF_GRACE_S, and the state line (always printed first) afterwards."""
    from gpuops.jobs import scripts
    from gpuops.remote import connection

    monkeypatch.setattr(connection, "EOF_GRACE_S", 0.1)
    got = bytearray()
    info = scripts.tail_stream(_Remote(_Late(0.6)), "r", "/tmp/x", 10, got.extend)
    assert info.exists and info.exit_code == 0, info
    assert bytes(got) == b"last line\n"


def test_the_grace_counts_from_the_last_bytes_read(monkeypatch):
    import time

    from gpuops.remote import connection

    monkeypatch.setattr(connection, "EOF_GRACE_S", 0.3)
    chan = paramiko.Channel(0)
    chan.exit_status = 0
    chan.status_event.set()
    seen: dict = {}
    assert not output_complete(chan, seen)
    time.sleep(0.2)
    assert not output_complete(chan, seen, got=True)  # bytes just read: the silence starts again
    time.sleep(0.2)
    assert not output_complete(chan, seen)  # 0.4 s after the status, 0.2 s after the bytes
    time.sleep(0.15)
    assert output_complete(chan, seen)


class _Said(_Late):
    """A channel whose stderr holds `lines` (a shell's own words before the state line, or no state line at all)."""

    def __init__(self, lines: bytes):
        self.lines = lines
        super().__init__(0.05)

    def _deliver(self) -> None:
        m = Message()
        m.add_int(1)
        m.add_string(self.lines)
        m.rewind()
        self._feed_extended(m)
        self._handle_eof(Message())


def test_the_state_line_is_found_after_the_shells_own_words_and_its_absence_is_not_run_not_found(monkeypatch):
    from gpuops.errors import RemoteError
    from gpuops.jobs import scripts
    from gpuops.remote import connection

    monkeypatch.setattr(connection, "EOF_GRACE_S", 0.1)
    got = scripts.tail_stream(_Remote(_Said(b"sh: 1: warning: something\nRUN id=r exists=1 pid=7 alive=0 rc=0 "
                                            b"started=1 ended=2 size=0 stop=-\n")), "r", "/tmp/x", 10, lambda b: None)
    assert got.exists and got.exit_code == 0
    with pytest.raises(RemoteError, match="could not read run r's state on the host .*: sh: cannot open"):
        scripts.tail_stream(_Remote(_Said(b"sh: cannot open\n")), "r", "/tmp/x", 10, lambda b: None)

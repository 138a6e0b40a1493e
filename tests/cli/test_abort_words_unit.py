"""Click turns any EOFError that escapes a command into Abort, the same as Ctrl-C. One that paramiko raised (a write
on a socket the peer closed) is a lost connection: exit 3 with its words, never "interrupted" (130)."""
from __future__ import annotations

import socket

import typer

from gpuops.cli import main


def _abort_from(fn) -> typer.Abort:
    try:
        try:
            fn()
        except (EOFError, KeyboardInterrupt) as exc:  # what click's main does with these
            raise typer.Abort() from exc
    except typer.Abort as abort:
        return abort
    raise AssertionError("nothing was raised")


def test_an_eof_of_the_ssh_transport_is_a_lost_connection(capsys):
    import paramiko

    mine, peer = socket.socketpair()
    peer.close()
    try:
        abort = _abort_from(lambda: paramiko.packet.Packetizer(mine).write_all(b"x" * 65536))
    finally:
        mine.close()
    assert isinstance(abort.__context__, EOFError)
    assert main._click_or_internal(abort) == 3
    err = capsys.readouterr().err
    assert "the connection to the host was lost" in err and "interrupted" not in err


def test_ctrl_c_and_a_prompt_whose_input_ended_stay_interrupted(capsys):
    def ctrl_c():
        raise KeyboardInterrupt

    def no_input():
        raise EOFError  # input() at a prompt with stdin closed

    for fn in (ctrl_c, no_input):
        assert main._click_or_internal(_abort_from(fn)) == 130
        assert capsys.readouterr().err.strip() == "interrupted"

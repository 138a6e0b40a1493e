"""Issue #36: a connection dropped while the host is judging the key is a lost connection (exit 3, retried, "lost
during authentication"), never "refused authentication ... check 'user:' and 'key:'", which sends the user to edit a
profile that is right. The host here is a paramiko SSH server that drops the connection when the client offers its
key (a host going down, a NAT dropping the flow); a host that really refuses the key (the sandbox's sshd with a key
it does not know) still says so."""
from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import yaml


class _DropsDuringAuth:
    """An SSH server on 127.0.0.1 that completes the key exchange and then, each time a client offers a key, closes
    the connection without an answer."""

    def __init__(self, tmp: Path):
        import paramiko

        self.key = paramiko.Ed25519Key.from_private_key_file(self._keygen(tmp / "host"))
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.offers = 0
        threading.Thread(target=self._serve, daemon=True).start()

    @staticmethod
    def _keygen(path: Path) -> str:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        return str(path)

    def _serve(self) -> None:
        import paramiko

        server = self

        class Iface(paramiko.ServerInterface):
            def __init__(self, conn):
                self.conn = conn

            def get_allowed_auths(self, username):
                return "publickey"

            def check_auth_publickey(self, username, key):
                server.offers += 1
                try:
                    self.conn.shutdown(socket.SHUT_RDWR)  # dropped: no answer, accepted or refused
                finally:
                    self.conn.close()
                return paramiko.AUTH_FAILED

        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = paramiko.Transport(conn)
            t.add_server_key(self.key)
            try:
                t.start_server(server=Iface(conn))
            except Exception:  # noqa: BLE001 - the client went away
                pass

    def close(self) -> None:
        self.sock.close()


def _profile(name: str, port: int, key: Path) -> None:
    d = Path(os.environ["GPUOPS_CONFIG_DIR"]) / "profiles"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.yaml").write_text(yaml.safe_dump({"host": "127.0.0.1", "port": port, "user": "ubuntu",
                                                    "key": str(key), "connect_timeout": 5}))


def test_a_drop_during_authentication_is_a_lost_connection_not_a_refusal(gpuops, tmp_path):
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    server = _DropsDuringAuth(tmp_path)
    try:
        _profile("dropping", server.port, key)
        r = gpuops("verify", "dropping")
    finally:
        server.close()
    assert r.code == 3, r.all
    assert "refused authentication" not in r.err and "check 'user:' and 'key:'" not in r.err, r.err
    assert "lost during authentication" in r.err, r.err
    assert "tried 3 times" in r.err and server.offers == 3, (server.offers, r.err)  # transient: retried


def test_a_key_the_host_does_not_know_is_still_a_refusal(sandbox, gpuops, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    data = yaml.safe_load(sandbox["profile"].read_text())
    _profile("stranger", data["port"], other)
    r = gpuops("verify", "stranger")
    assert r.code == 3 and "refused authentication" in r.err and "check 'user:' and 'key:'" in r.err, r.all

"""A server that never answers, for what must give up in time (W&B, an index)."""
from __future__ import annotations


class Blackhole:
    """A TCP server on 127.0.0.1 that accepts connections and never answers: a W&B server that hangs."""

    def __init__(self):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = []
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(conn)

    def close(self):
        self.sock.close()
        for c in self.accepted:
            c.close()

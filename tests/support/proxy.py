"""A small TCP proxy for tests: forwards 127.0.0.1:<port> to a target, and can add latency or cut
connections after N bytes (server to client), to exercise resume and reconnect paths."""
from __future__ import annotations

import socket
import threading
import time


class Proxy:
    def __init__(self, target_port: int, *, delay: float = 0.0, cut_after: int | None = None, target_host: str = "127.0.0.1",
                 rate: float | None = None, listen_host: str = "127.0.0.1", listen_port: int = 0,
                 hold_on_eof: bool = False):
        self.target = (target_host, target_port)
        self.delay = delay
        self.cut_after = cut_after  # bytes server->client per connection, then both sides are closed
        self.rate = rate  # bytes per second in each direction, over every connection together (a throttled link)
        # the client's EOF is not passed on, nor does it close anything: the server goes on sending, and the client,
        # whose own writes now fail, reads on (a peer gone in one direction before the client's reader noticed)
        self.hold_on_eof = hold_on_eof
        self.connections = 0
        self.bytes_down = 0
        self.bytes_up = 0
        self._free = {"down": 0.0, "up": 0.0}  # direction -> when the link is free again (monotonic)
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((listen_host, listen_port))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                self.connections += 1
                self._open += [client, upstream]
            state = {"down": 0}
            threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, state), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, counter: dict | None) -> None:
        held = False
        try:
            while True:
                data = src.recv(16384)
                if not data:
                    held = counter is None and self.hold_on_eof  # both sockets stay open, the other way goes on
                    break
                if self.delay:
                    time.sleep(self.delay)
                if self.rate:
                    self._throttle("down" if counter is not None else "up", len(data))
                if counter is not None and self.cut_after is not None:
                    room = self.cut_after - counter["down"]
                    if room <= 0:
                        break
                    data = data[:room]
                    counter["down"] += len(data)
                dst.sendall(data)
                if counter is None:
                    with self._lock:
                        self.bytes_up += len(data)
                if counter is not None:
                    with self._lock:
                        self.bytes_down += len(data)
                    if self.cut_after is not None and counter["down"] >= self.cut_after:
                        break
        except OSError:
            pass
        finally:
            for s in () if held else (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()

    def _throttle(self, way: str, n: int) -> None:
        """Wait until sending n more bytes in this direction keeps the link at `rate` bytes per second."""
        with self._lock:
            now = time.monotonic()
            due = self._free[way] = max(now, self._free[way]) + n / self.rate  # no credit saved up while idle
        wait = due - now
        if wait > 0:
            time.sleep(wait)

    def cut_all(self) -> None:
        """Close every open connection now (the listener stays)."""
        with self._lock:
            socks, self._open = self._open, []
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self.cut_all()

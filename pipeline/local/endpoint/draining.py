"""A threading HTTP server that stops without dropping a request. A connection is tracked from its accept until its
socket is closed; its handler marks it busy once a request line is read (`track`) and answers with `Connection: close`
while `draining`. `stop_serving()` stops accepting, answers the connections still queued at the listener, and
`drain()`s: waits for each connection to end after its next answer, then closes those still idle."""

from __future__ import annotations

import select
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

DRAIN_SECONDS = 3.0  # stopping: how long idle keep-alive connections may bring one more request


class DrainingServer(ThreadingHTTPServer):
    daemon_threads = True
    draining = False  # stopping: every answer says `Connection: close`, idle connections close between requests

    def server_activate(self) -> None:
        super().server_activate()
        self.connections: dict[socket.socket, bool] = {}  # open connections: whether a request is being answered
        self.connections_lock = threading.Lock()

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        self.track(request, False)  # from the accept: a connection whose thread has not started yet is waited for
        super().process_request(request, client_address)

    def shutdown_request(self, request: socket.socket) -> None:
        super().shutdown_request(request)
        self.track(request, None)  # once closed: the process may exit without resetting it

    def stop_serving(self, timeout: float) -> None:
        """Stop accepting, answer the connections already queued at the listener (closing it would reset them),
        close it, and `drain` (up to twice `timeout` seconds)."""
        self.shutdown()
        self.draining = True
        self.socket.setblocking(False)
        while True:
            try:
                request, client_address = self.get_request()
            except OSError:  # none left waiting
                break
            self.process_request(request, client_address)
        self.server_close()
        self.drain(timeout)

    def track(self, connection: socket.socket, busy: bool | None) -> None:
        """Record a connection as busy (a request read), idle (between requests) or closed (None)."""
        with self.connections_lock:
            if busy is None:
                self.connections.pop(connection, None)
            else:
                self.connections[connection] = busy

    def drain(self, timeout: float) -> None:
        """Once no longer accepting: let each connection end after its next answer; after `timeout` close the
        idle ones (nothing of a request read or waiting) and wait as long again for the busy ones to finish."""
        self.draining = True
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            time.sleep(0.02)
        deadline = time.monotonic() + timeout
        while self.connections and time.monotonic() < deadline:
            with self.connections_lock:
                idle = [c for c, busy in self.connections.items() if not busy and not _pending(c)]
            for connection in idle:
                try:
                    connection.shutdown(socket.SHUT_RDWR)  # its handler reads end-of-file and closes it
                except OSError:
                    pass
                self.track(connection, None)
            time.sleep(0.02)



def _pending(connection: socket.socket) -> bool:
    """Whether bytes of a next request wait on `connection` (then it is not idle)."""
    try:
        return bool(select.select([connection], [], [], 0)[0])
    except (OSError, ValueError):  # closed meanwhile
        return False

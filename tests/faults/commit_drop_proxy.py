"""A TCP proxy in front of PostgreSQL that drops a connection after forwarding the COMMIT of a
result commit, before PostgreSQL's reply reaches the client: the commit lands, and the client
only sees its connection die -- a network fault, not a mock.

A result commit is recognised by its statement (the UPDATE that adds to a batch's counters), and
its COMMIT by psycopg's simple-protocol ``COMMIT`` query message.
"""

from __future__ import annotations

import socket
import threading

# The counter increment only a result commit makes (SQLAlchemy renders SET in the table's column order).
_RESULT_COMMIT = b"completed=(batches.completed +"
_COMMIT = b"Q\x00\x00\x00\x0bCOMMIT\x00"
_CHUNK = 1 << 16


class CommitDropProxy:
    """Listens on a free loopback port; drops the first ``drops`` result-commit replies."""

    def __init__(self, upstream_port: int, drops: int) -> None:
        self.upstream_port = upstream_port
        self.left = drops
        self.dropped = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            threading.Thread(target=self._to_server, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()

    def _to_server(self, client: socket.socket, upstream: socket.socket) -> None:
        """Client to PostgreSQL; the other direction's pump closes ``upstream`` once PostgreSQL
        has answered and hung up."""
        in_result_commit = False
        try:
            while data := client.recv(_CHUNK):
                in_result_commit = in_result_commit or _RESULT_COMMIT in data
                if in_result_commit and _COMMIT in data and self._take_drop():
                    client.close()  # before the reply can reach it: the client cannot know the commit landed
                    upstream.sendall(data)
                    break
                if _COMMIT in data:
                    in_result_commit = False
                upstream.sendall(data)
            upstream.shutdown(socket.SHUT_WR)  # PostgreSQL runs what it was sent, then sees the end
        except OSError:
            upstream.close()
        finally:
            client.close()

    def _take_drop(self) -> bool:
        with self._lock:
            if self.left == 0:
                return False
            self.left -= 1
            self.dropped += 1
            return True


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(_CHUNK):
            target.sendall(data)
    except OSError:
        pass
    finally:
        source.close()
        target.close()

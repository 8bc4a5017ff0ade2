"""A TCP listener on 127.0.0.1 that notes every connection: a test fails if the server ever reaches it.

Bounded: it accepts with a short timeout, closes what it accepts at once, and
its thread is joined (within 5 s) when the ``with`` block ends.
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType
from typing import Self


class Listener:
    """``with Listener() as listener``: ``listener.url`` to put in a request, ``listener.connections`` after."""

    def __init__(self) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(16)
        self._socket.settimeout(0.05)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="listener", daemon=True)
        self.connections = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._socket.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                peer, _ = self._socket.accept()
            except TimeoutError:
                continue
            self.connections += 1
            peer.close()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._socket.close()

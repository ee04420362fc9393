"""The server's keys taken out of SGLang's ``/server_info``, which any key holder may read.

SGLang answers ``/server_info`` with its arguments, its keys among them (``api_key``,
``admin_api_key`` and the launch command). Stock SGLang shows them only to its one ``--api-key``;
once every team's key passes (`server.key_gate`), a team would read the admin key there and
see everyone's batches, or SGLang's ``--api-key`` and read its batches. So every configured key
is replaced by ``<redacted>`` in that answer, wherever it stands in it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

INFO_PATHS = ("/server_info", "/get_server_info")
REDACTED = "<redacted>"


class RedactKeys:
    """ASGI middleware: ``keys`` out of ``app``'s JSON answers on `INFO_PATHS`."""

    def __init__(self, app: ASGIApp, keys: Iterable[str]) -> None:
        self.app = app
        self.keys = sorted(set(keys), key=len, reverse=True)  # a key inside a longer one goes last

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in INFO_PATHS or not self.keys:
            await self.app(scope, receive, send)
            return
        start: Message = {}
        body = bytearray()

        async def redacted(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False):
                return
            answer = self._redacted(bytes(body))
            headers = [(name, value) for name, value in start["headers"] if name.lower() != b"content-length"]
            await send({**start, "headers": [*headers, (b"content-length", str(len(answer)).encode())]})
            await send({"type": "http.response.body", "body": answer})

        await self.app(scope, receive, redacted)

    def _redacted(self, body: bytes) -> bytes:
        try:
            return json.dumps(self._walk(json.loads(body))).encode()
        except ValueError:
            return self._walk(body.decode(errors="replace")).encode()

    def _walk(self, value: Any) -> Any:
        if isinstance(value, str):
            for key in self.keys:
                value = value.replace(key, REDACTED)
            return value
        if isinstance(value, list):
            return [self._walk(item) for item in value]
        if isinstance(value, dict):
            return {name: self._walk(item) for name, item in value.items()}
        return value

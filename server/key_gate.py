"""One key check in front of SGLang's routes, so a server that has keys serves nobody without one.

SGLang's own ``--api-key`` middleware takes one key, and on its ordinary routes none at all when
only ``--admin-api-key`` is set; with only the Batch API's keys it is not even installed. So an
operator who gave each team a key still served anyone who could reach the port, and a team's key
worked on ``/v1/batches`` but not on ``/v1/chat/completions``. When the Batch API is on, the
server takes SGLang's middleware out (`sglang_boundary.replace_key_middleware`) and this gate
decides instead, with the Batch API's own check (`BatchKeys.caller`): once any key is configured,
every route takes any of them (``--api-key``, ``--batch-api-keys``, ``--batch-api-keys-file``,
``--admin-api-key``), WebSockets too, which SGLang's middleware never checked. What SGLang
leaves open for probes and scrapers stays open (``/health*``, ``/ready*``, ``/metrics*``, CORS
preflights), and so do SGLang's admin levels: a route SGLang marks admin-optional
(``/flush_cache``, ``/update_weights_from_disk``, ...) takes the admin key alone once one is set,
and one it marks admin-force is refused (403) on a server without one. A refusal is 401 in
OpenAI's error shape (``invalid_api_key``).

The request carries who sent it: `KEY_OWNER` in its ASGI scope's ``state`` (``request.state``
to SGLang's handlers) is the key's `key_owner` -- the hash a batch records, never the key -- or
None on a server with no key; a debug log line says it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from sgl_blend.server.auth import BatchKeys, Caller
from sgl_blend.server.errors import ApiError

logger = logging.getLogger(__name__)

KEY_OWNER = "sgl_blend_key_owner"
# SGLang's own open paths (``sglang.srt.utils.auth.decide_request_auth``): load balancers' and
# Prometheus's probes carry no key.
OPEN_PREFIXES = ("/health", "/ready", "/metrics")
# SGLang's ``AuthLevel`` values of its admin routes (a str enum, so its members compare equal).
ADMIN_OPTIONAL, ADMIN_FORCE = "admin_optional", "admin_force"


class KeyGate:
    """ASGI middleware: ``app`` (SGLang's stack) behind ``keys``; ``level`` names the SGLang
    auth level of the route a request goes to."""

    def __init__(self, app: ASGIApp, keys: BatchKeys, level: Callable[[Scope], str]) -> None:
        self.app, self.keys, self.level = app, keys, level

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] not in ("http", "websocket")
            or scope.get("method") == "OPTIONS"
            or scope["path"].startswith(OPEN_PREFIXES)
        ):
            await self.app(scope, receive, send)
            return
        try:
            caller = admitted(self.keys, Headers(scope=scope).get("authorization"), self.level(scope))
        except ApiError as error:
            # SGLang checks no WebSocket (``/v1/realtime``); closed before it opens, it is refused with 403.
            refusal: ASGIApp = (
                JSONResponse(error.body(), error.status) if scope["type"] == "http" else WebSocketClose(1008)
            )
            await refusal(scope, receive, send)
            return
        scope.setdefault("state", {})[KEY_OWNER] = caller.owner
        logger.debug("%s %s from key owner %s", scope.get("method", "WEBSOCKET"), scope["path"], caller.owner)
        await self.app(scope, receive, send)


def admitted(keys: BatchKeys, authorization: str | None, level: str) -> Caller:
    """The caller of a request to a route of SGLang auth ``level``; `ApiError` when refused."""
    caller = keys.caller(authorization)
    if level == ADMIN_FORCE and not keys.admin_key:
        raise ApiError(
            403, "this route needs the admin key, and the server has none (--admin-api-key)", code="admin_key_unset"
        )
    if level in (ADMIN_OPTIONAL, ADMIN_FORCE) and keys.admin_key and not caller.sees_all:
        raise ApiError(401, "this route takes the admin key only (--admin-api-key)", code="invalid_api_key")
    return caller

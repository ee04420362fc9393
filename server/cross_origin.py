"""Browsers may reach the Batch API only from origins the operator named (``--batch-cors-origins``).

SGLang's app allows any origin, with credentials, on every route. For the Batch API that would let
any web page a user opens create, read and cancel batches on a server the browser can reach -- a
keyless server on localhost above all: a form post is a "simple" request that no CORS preflight
guards, so hiding the answer from the page is not enough, the request must not run. So a request
that comes from a browser (it carries ``Origin``, or ``Sec-Fetch-Site`` other than ``none``, which
a page's own same-origin requests carry too, so a DNS-rebound page is refused as well) is refused
with 403 unless its origin is one of the allowed ones; those get CORS headers for them alone.
Requests from programs (the `openai` client, curl) carry neither header and pass.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from sgl_blend.server.errors import ApiError

ANY_ORIGIN = "*"


class BrowserGuard:
    """ASGI middleware: refuse browsers' requests from origins not in ``allowed`` (``*``: any)."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            origin, site = headers.get("origin"), headers.get("sec-fetch-site")
            if (origin is not None or site not in (None, "none")) and not self._allows(origin):
                error = ApiError(
                    403,
                    f"requests from the web origin {origin or '(this page)'} are not allowed on the "
                    "Batch API; the server's operator can allow it with --batch-cors-origins",
                    code="origin_not_allowed",
                )
                await JSONResponse(error.body(), status_code=error.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _allows(self, origin: str | None) -> bool:
        return origin is not None and (origin in self.allowed or ANY_ORIGIN in self.allowed)


def guard_browsers(app: ASGIApp, allowed: Sequence[str]) -> ASGIApp:
    """``app`` behind the guard, with CORS answers (preflights included) for the allowed origins."""
    if allowed:
        app = CORSMiddleware(
            app,
            allow_origins=list(allowed),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["*"],
            allow_credentials=False,
        )
    return BrowserGuard(app, allowed)

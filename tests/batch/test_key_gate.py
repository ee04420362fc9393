"""The key gate's decisions that the real servers' tests (`test_online_keys`, `test_api_in_front`)
do not reach: the key owner each request carries, SGLang's admin levels on a server without an
admin key, and the paths left open. On a small app of its own behind the gate, with the levels
given by path as SGLang's route table would give them."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from sgl_blend.client import http
from sgl_blend.server.auth import BatchKeys
from sgl_blend.server.key_gate import ADMIN_FORCE, ADMIN_OPTIONAL, KEY_OWNER, KeyGate
from sgl_blend.server.store import key_owner

TEAM, ADMIN = "sk-team", "sk-admin"
LEVELS = {"/flush_cache": ADMIN_OPTIONAL, "/forced": ADMIN_FORCE}


def gated(keys: BatchKeys) -> KeyGate:
    async def owner(request: Request) -> JSONResponse:
        return JSONResponse({"owner": getattr(request.state, KEY_OWNER, "unset")})

    paths = ("/v1/models", "/health", "/metrics", "/flush_cache", "/forced")
    app = Starlette(routes=[Route(path, owner, methods=["GET", "OPTIONS"]) for path in paths])
    return KeyGate(app, keys, lambda scope: LEVELS.get(scope["path"], "normal"))


def answer(gate: KeyGate, path: str, key: str | None = None, method: str = "GET") -> httpx.Response:
    async def send() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gate), base_url="http://gated") as client:
            return await client.request(method, path, headers=http.auth_headers(key))

    return asyncio.run(send())


def test_each_request_carries_its_keys_owner_never_the_key() -> None:
    gate = gated(BatchKeys(user_keys=(TEAM,), admin_key=ADMIN))
    for key in (TEAM, ADMIN):
        assert answer(gate, "/v1/models", key).json() == {"owner": key_owner(key)}
    assert answer(gated(BatchKeys()), "/v1/models").json() == {"owner": None}


def test_admin_routes_take_the_admin_key_once_there_is_one() -> None:
    with_admin, without = gated(BatchKeys(user_keys=(TEAM,), admin_key=ADMIN)), gated(BatchKeys(user_keys=(TEAM,)))
    assert answer(with_admin, "/flush_cache", TEAM).status_code == 401
    assert answer(with_admin, "/flush_cache", ADMIN).status_code == 200
    assert answer(without, "/flush_cache", TEAM).status_code == 200
    assert answer(with_admin, "/forced", ADMIN).status_code == 200
    for gate in (without, gated(BatchKeys())):  # SGLang refuses an admin-force route without an admin key
        refused = answer(gate, "/forced", TEAM)
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_key_unset"


def test_probes_and_preflights_need_no_key() -> None:
    gate = gated(BatchKeys(user_keys=(TEAM,), admin_key=ADMIN))
    for path in ("/health", "/metrics"):
        assert answer(gate, path).status_code == 200, path
    assert answer(gate, "/v1/models", method="OPTIONS").status_code == 200
    assert answer(gate, "/v1/models").status_code == 401


def test_a_websocket_needs_a_key_too() -> None:
    """SGLang's own check lets every WebSocket (``/v1/realtime``) through; the gate closes one
    without a key before it opens, which the server answers with 403."""
    opened: list[str] = []

    async def app(scope: Scope, _receive: Receive, _send: Send) -> None:
        opened.append(scope["state"][KEY_OWNER])

    async def connect(key: str | None) -> list[Message]:
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "websocket.connect"}

        async def send(message: Message) -> None:
            sent.append(message)

        headers = [(name.lower().encode(), value.encode()) for name, value in http.auth_headers(key).items()]
        scope = {"type": "websocket", "path": "/v1/realtime", "headers": headers}
        await KeyGate(app, BatchKeys(user_keys=(TEAM,)), lambda _scope: "normal")(scope, receive, send)
        return sent

    assert [message["type"] for message in asyncio.run(connect(None))] == ["websocket.close"] and not opened
    assert asyncio.run(connect(TEAM)) == [] and opened == [key_owner(TEAM)]

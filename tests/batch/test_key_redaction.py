"""The keys leave SGLang's ``/server_info`` answer wherever they stand in it, and nothing else of
it or of other routes changes (`server.key_redaction`). The real server's answer is checked in
`tests.batch.key_checks`; this covers the shapes it may take, on a small app of its own."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from sgl_blend.server.key_redaction import REDACTED, RedactKeys

KEYS = ("sk-admin", "sk-admin-2", "sk-team")
INFO = {"api_key": "sk-team", "admin_api_key": "sk-admin-2", "port": 30000,
        "launch_command": "x --admin-api-key sk-admin", "internal_states": [{"sgl_blend": {"nested": "sk-team"}}]}


def answer(path: str) -> httpx.Response:
    async def info(_request: object) -> JSONResponse:
        return JSONResponse(INFO)

    async def text(_request: object) -> PlainTextResponse:
        return PlainTextResponse("sk-team")

    app = Starlette(routes=[Route("/server_info", info), Route("/get_server_info", text), Route("/v1/models", info)])

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=RedactKeys(app, KEYS))
        async with httpx.AsyncClient(transport=transport, base_url="http://info") as client:
            return await client.get(path)

    return asyncio.run(send())


def test_every_key_leaves_the_server_info() -> None:
    redacted = answer("/server_info")
    assert redacted.json() == {**INFO, "api_key": REDACTED, "admin_api_key": REDACTED,
                               "launch_command": f"x --admin-api-key {REDACTED}",
                               "internal_states": [{"sgl_blend": {"nested": REDACTED}}]}
    assert int(redacted.headers["content-length"]) == len(redacted.content)
    assert answer("/get_server_info").text == REDACTED


def test_other_routes_pass_unchanged() -> None:
    assert answer("/v1/models").json() == INFO

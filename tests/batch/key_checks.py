"""Which requests a running server takes, route by route, for the tests of its key model
(`server.key_gate`): with keys, each of them works on SGLang's online routes and the Batch API
alike, and a missing or wrong key is refused everywhere but the health probes; without keys,
everything is open."""

from __future__ import annotations

from collections.abc import Sequence

import httpx
import openai
import pytest

from sgl_blend.client import http

CHAT = {"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
GENERATE = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
# One request on each kind of route: SGLang's OpenAI routes, its own, and the Batch API.
ROUTES = (("POST", "/v1/chat/completions", CHAT), ("POST", "/generate", GENERATE), ("GET", "/v1/models", None),
          ("GET", "/server_info", None), ("GET", "/v1/batches", None))


def answer(base_url: str, method: str, path: str, body: dict | None, key: str | None) -> httpx.Response:
    return httpx.request(method, base_url + path, json=body, headers=http.auth_headers(key), timeout=60)


def assert_only_keys_pass(base_url: str, keys: Sequence[str]) -> None:
    """Each of ``keys`` works on every route through the official client and raw HTTP, and none of
    them can read another in ``/server_info``; no key, a wrong key or a key's prefix gets 401 in
    OpenAI's error shape; the health probes stay open."""
    info = answer(base_url, "GET", "/server_info", None, keys[0]).text
    assert not [key for key in keys if key in info]
    for key in keys:
        client = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
        assert client.chat.completions.create(**CHAT).choices
        assert client.batches.list().data is not None
        for method, path, body in ROUTES:
            assert answer(base_url, method, path, body, key).status_code == 200, (key, path)
    for wrong in (None, "sk-wrong", keys[0][:-1]):
        for method, path, body in ROUTES:
            refused = answer(base_url, method, path, body, wrong)
            assert refused.status_code == 401, (wrong, path, refused.text)
            error = refused.json()["error"]
            assert error["code"] == "invalid_api_key" and error["param"] is None, (wrong, path, error)
            assert error["type"] == "invalid_request_error" and error["message"]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{base_url}/v1", api_key="sk-wrong", max_retries=0).chat.completions.create(
            **CHAT
        )
    for path in ("/health", "/health_generate"):
        assert httpx.get(base_url + path, timeout=60).status_code == 200, path


def assert_open(base_url: str) -> None:
    """A server without keys takes every request without one, as SGLang does."""
    for method, path, body in ROUTES:
        assert answer(base_url, method, path, body, None).status_code == 200, path

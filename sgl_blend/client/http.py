"""The one HTTP client stack for talking to servers: SGLang's routes, the Batch API, a worker's
``/server_info``. Everything is httpx, sync (`client`) or async (`async_client`).

- The API key becomes a request header in `auth_headers` and nowhere else; the server URL and key
  a command falls back to (``$SGLBLEND_URL``, ``$SGLBLEND_API_KEY``) are resolved in `server_url`
  and `api_key`, which the official `openai` client of `client.batches` takes them from too.
- `NoAnswer` is every failure to get an HTTP answer at all (refused, dropped, timed out): the
  request may never have reached the server, unlike an answer with an error status.
- `Backoff` is the one way to wait between attempts at something that keeps failing: callers that
  must not block read its `ready`; blocking ones go through `retry`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx

URL_ENV, API_KEY_ENV = "SGLBLEND_URL", "SGLBLEND_API_KEY"
DEFAULT_URL = "http://127.0.0.1:30000"
NoAnswer = httpx.RequestError
# A generation's answer comes whole at its end, so the read timeout bounds one request's whole
# time in the engine: waiting in its queue (the runner keeps about two running batches' worth
# there) and generating. Half an hour is a 60,000-token generation at 30 ms a step, far past any
# real line; an answer later than that means the request is lost (a peer that vanished without
# closing the connection, an engine that dropped it) and it is sent again. A hung scheduler is
# found sooner by SGLang's own watchdog (``--watchdog-timeout``, 300 s), which kills the server
# and so drops every connection to it at once.
GENERATION_READ_TIMEOUT_S = 1800.0
GENERATION_TIMEOUT = httpx.Timeout(connect=30.0, read=GENERATION_READ_TIMEOUT_S, write=60.0, pool=None)

T = TypeVar("T")


def server_url(url: str | None = None) -> str:
    """``url``, else ``$SGLBLEND_URL``, else the default port on this machine; no trailing slash."""
    return (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/")


def api_key(key: str | None = None) -> str | None:
    """``key``, else ``$SGLBLEND_API_KEY``; None when neither is set."""
    return key or os.environ.get(API_KEY_ENV) or None


def auth_headers(key: str | None) -> dict[str, str]:
    """The header that carries an API key (SGLang and the Batch API both take a Bearer token)."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def client(base_url: str = "", key: str | None = None, *, timeout: float | None = 60.0) -> httpx.Client:
    """A blocking client for short calls (health, settings, server info)."""
    return httpx.Client(base_url=base_url, headers=auth_headers(key), timeout=timeout)


def async_client(
    base_url: str = "",
    key: str | None = None,
    *,
    max_connections: int | None = 100,
    keep_alive: bool = True,
    timeout: float | httpx.Timeout | None = GENERATION_TIMEOUT,
    headers: Mapping[str, str] | None = None,
) -> httpx.AsyncClient:
    """A client that really holds ``max_connections`` requests in flight (None: no limit); more
    wait, without a time limit, for a connection to free up. ``keep_alive=False`` opens a
    connection per request: reusing one that the server's keep-alive timer is closing at that
    moment fails the request, which a latency measurement must not count."""
    limits = httpx.Limits(
        max_connections=max_connections, max_keepalive_connections=max_connections if keep_alive else 0
    )
    return httpx.AsyncClient(
        base_url=base_url, headers={**(headers or {}), **auth_headers(key)}, timeout=timeout, limits=limits
    )


def server_info(url: str, key: str | None = None, *, timeout: float = 60.0) -> dict[str, Any]:
    """A server's ``GET /server_info``: its SGLang settings (``dp_size``, ``tp_size``, ...) and each
    scheduler's ``internal_states``. Raises `NoAnswer` or `httpx.HTTPStatusError`."""
    with client(url, key, timeout=timeout) as http:
        return _json_answer(http.get("/server_info"))


async def server_info_async(http: httpx.AsyncClient, url: str, *, timeout: float = 60.0) -> dict[str, Any]:
    """`server_info` through an open async client (which carries the key)."""
    return _json_answer(await http.get(url + "/server_info", timeout=timeout))


def dp_size(info: Mapping[str, Any]) -> int:
    """The DP ranks a server runs, from its `server_info`."""
    return max(1, int(info.get("dp_size") or 1))


def switched_off(info: Mapping[str, Any]) -> list[str]:
    """The sgl-blend parts an error switched off on any scheduler, from its `server_info`: where
    they are, SGLang scheduled that work its own way."""
    states = [state.get("sgl_blend") or {} for state in info.get("internal_states") or ()]
    return sorted({part for state in states for part in state.get("switched_off", ())})


def _json_answer(response: httpx.Response) -> dict[str, Any]:
    response.raise_for_status()
    return response.json()


class Backoff:
    """Pauses between attempts at something that keeps failing: the first failure pauses
    ``first_s``, each further one twice as long, up to ``max_s``; a success starts over."""

    def __init__(self, first_s: float = 0.25, max_s: float = 10.0) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.delay_s = 0.0
        self.ready_at = 0.0
        self.failing_since: float | None = None

    def failed(self, now: float | None = None) -> float:
        """Record a failure at ``now`` (monotonic); returns the pause before the next attempt."""
        now = time.monotonic() if now is None else now
        self.delay_s = min(self.max_s, max(self.first_s, self.delay_s * 2))
        self.ready_at = now + self.delay_s
        if self.failing_since is None:
            self.failing_since = now
        return self.delay_s

    def succeeded(self) -> None:
        """The next failure pauses ``first_s`` again (a pause already under way still runs out)."""
        self.delay_s, self.failing_since = 0.0, None

    def ready(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) >= self.ready_at

    def failing_for(self, now: float | None = None) -> float:
        """Seconds since the first failure with no success after it (0 while not failing)."""
        if self.failing_since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self.failing_since


def retry(
    attempt: Callable[[], T],
    *,
    timeout_s: float,
    retry_on: tuple[type[BaseException], ...] = (httpx.HTTPError,),
    backoff: Backoff | None = None,
) -> T:
    """Call ``attempt`` until it returns. An exception in ``retry_on`` (by default no answer, or an
    error status that `raise_for_status` raised) pauses as ``backoff`` says and tries again, until
    the next try would start past ``timeout_s``: then it is raised. Other exceptions pass at once."""
    backoff = backoff or Backoff()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return attempt()
        except retry_on:
            pause = backoff.failed()
            if time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)

"""Sending one prepared batch line to a server, and turning its answer into an output or error record.

The batch runner (behind the Batch API and `sgl-blend run-batch` alike) sends every line this way.
A line that got no answer at all (connection refused or dropped) raises `WorkerUnreachable`
instead of becoming a record: it has not run, so the caller decides whether to send it again or
to give up on it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Mapping

import httpx

from sgl_blend.client import http
from sgl_blend.batch_lines.lines import PreparedRequest, output_record

# The routes whose request carries SGLang's ``routed_dp_rank`` (embedding requests have no such field).
DP_ROUTED_URLS = ("/v1/chat/completions", "/v1/completions")


class WorkerUnreachable(Exception):
    """The server gave no HTTP answer for a line (it may be down or restarting)."""


@dataclass(frozen=True)
class LineUsage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    @classmethod
    def from_body(cls, body: Any) -> LineUsage:
        usage = body.get("usage") if isinstance(body, dict) else None
        if not isinstance(usage, dict):
            return cls()
        details = usage.get("prompt_tokens_details") or {}
        return cls(int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                   int(details.get("cached_tokens") or 0))

    def __add__(self, other: LineUsage) -> LineUsage:
        return LineUsage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens,
                         self.cached_tokens + other.cached_tokens)

    def report(self, seconds: float) -> dict[str, Any]:
        """Token counts, cache-hit ratio and rates over ``seconds``: what a finished job reports."""
        total = self.prompt_tokens + self.completion_tokens
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cache_hit_ratio": round(self.cached_tokens / self.prompt_tokens, 4) if self.prompt_tokens else 0.0,
            "seconds": round(seconds, 2),
            "tokens_per_s": round(total / seconds, 1) if seconds else 0.0,
            "output_tokens_per_s": round(self.completion_tokens / seconds, 1) if seconds else 0.0,
        }


@dataclass(frozen=True)
class LineOutcome:
    """A line's answer: ``ok`` lines go to the output file, the others to the error file.
    ``aborted``: SGLang stopped the request before it finished (``finish_reason`` abort)."""

    ok: bool
    record: dict[str, Any]
    usage: LineUsage
    aborted: bool = False


async def send_request(client: httpx.AsyncClient, base_url: str, custom_id: str, request: PreparedRequest,
                       headers: Mapping[str, str] | None = None, rid: str | None = None,
                       dp_rank: int | None = None) -> LineOutcome:
    """POST the line's prepared request to ``base_url + request.url``; any HTTP answer becomes the
    line's record. ``rid`` names the request inside SGLang, so that `abort_requests` can stop it;
    ``dp_rank`` has SGLang's DP controller run it on that rank (chat and completion lines)."""
    body = request.body_with(rid=rid, routed_dp_rank=dp_rank if request.url in DP_ROUTED_URLS else None)
    try:
        response = await client.post(base_url + request.url, content=body,
                                     headers={"Content-Type": "application/json", **(headers or {})})
    except http.NoAnswer as error:
        raise WorkerUnreachable(f"{base_url}: {type(error).__name__}: {error}") from error
    text, status = response.text, response.status_code
    try:
        answer = json.loads(text)
    except json.JSONDecodeError:
        answer = {"error": {"message": text[:2000]}}
    if status != 200:
        return LineOutcome(False, output_record(custom_id, status, answer), LineUsage())
    request_id = answer.get("id") if isinstance(answer, dict) else None
    aborted = any(choice.get("finish_reason") == "abort" for choice in (answer.get("choices") or [])
                  if isinstance(choice, dict)) if isinstance(answer, dict) else False
    return LineOutcome(not aborted, output_record(custom_id, status, answer, request_id),
                       LineUsage.from_body(answer), aborted)


async def abort_requests(client: httpx.AsyncClient, base_url: str, rids: list[str],
                         headers: Mapping[str, str] | None = None) -> None:
    """Stop requests a server is still running (``POST /abort_request``); each answers at once
    with ``finish_reason`` abort. Dropping the connection instead leaves SGLang to notice the
    disconnect on a later poll, which under load lags by many seconds of wasted decoding. A
    request already gone needs nothing, so failures pass."""
    async def abort(rid: str) -> None:
        try:
            await client.post(base_url + "/abort_request", json={"rid": rid}, headers=headers)
        except http.NoAnswer:
            pass

    await asyncio.gather(*(abort(rid) for rid in rids))

"""What running one batch line came to: its output or error record, its token usage, and whether
the answer was the line's own or the engine's trouble.

Whichever way a line ran (in the server's own process, or on a remote worker through its line
route), what could not have been the line's own fault never becomes its record:

- no connection at all (nothing listens) raises `WorkerUnreachable`: the line has not run;
- a connection that broke or timed out before the answer raises `AnswerLost`: it may have run,
  and running it again is harmless (a result is committed only while its line is pending);
- an answer that is transient (`LineOutcome.transient`: an engine 5xx, 408 or 429, or an abort)
  is returned, and the caller decides -- an abort it asked for is final, anything else it retries.

Every other answer (200, or a 4xx the body earned) is the line's result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sgl_blend.batch_lines.lines import error_record, output_record

# Answers that say the server could not serve the request now, not that the request is wrong.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


class WorkerUnreachable(Exception):
    """No connection to the server could be made for a line (it may be down or restarting)."""


class AnswerLost(Exception):
    """The connection broke, or the answer did not come in time, after the line was sent."""


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
        return cls(
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            int(details.get("cached_tokens") or 0),
        )

    def __add__(self, other: LineUsage) -> LineUsage:
        return LineUsage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
        )

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
    ``aborted``: SGLang stopped the request before it finished (``finish_reason`` abort);
    ``status``: the HTTP status of the answer (0 for a record made without one)."""

    ok: bool
    record: dict[str, Any]
    usage: LineUsage
    aborted: bool = False
    status: int = 0

    @property
    def transient(self) -> bool:
        """The server could not serve the line now; the same request may well succeed later."""
        return self.aborted or self.status in TRANSIENT_STATUSES


def answer_outcome(custom_id: str, status: int, answer: Any) -> LineOutcome:
    """The outcome of the engine's answer to a line: an HTTP status and the body the OpenAI route
    would have sent (a 200's choices each carry a ``finish_reason``; ``abort`` says SGLang stopped
    the request before it finished)."""
    if status != 200:
        return LineOutcome(False, output_record(custom_id, status, answer), LineUsage(), status=status)
    request_id = answer.get("id") if isinstance(answer, dict) else None
    aborted = (
        any(
            choice.get("finish_reason") == "abort"
            for choice in (answer.get("choices") or [])
            if isinstance(choice, dict)
        )
        if isinstance(answer, dict)
        else False
    )
    return LineOutcome(
        not aborted, output_record(custom_id, status, answer, request_id), LineUsage.from_body(answer), aborted, status
    )


def aborted_outcome(custom_id: str) -> LineOutcome:
    """The outcome of a line the runner aborted before SGLang answered it."""
    return LineOutcome(
        False,
        error_record(custom_id, "aborted", "the batch stopped before this request ran"),
        LineUsage(),
        aborted=True,
    )

"""What a batch line's body may be: what SGLang's own request model for its route accepts, within
this server's caps on how much one line may ask for.

A body SGLang would refuse (a wrong type anywhere, a message without a role, ``max_tokens: 0`` on
completions) fails at validation, alone, instead of after it waited its turn in the plan; and a
body asking for more than the caps allow (``n: 1000000``, ``max_tokens: 10**12``) fails before
anything sizes plans, KV reservations or result files by it. The models are SGLang's
(``sglang.srt.entrypoints.openai.protocol``), validated against the exact bytes the line will be
sent as (to a remote worker), since some of SGLang's validators rewrite the dict they are given.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

DEFAULT_MAX_N = 16
DEFAULT_MAX_TOKENS = 131_072
_SHOWN_ERRORS = 3
# The body fields that multiply what one line generates, and those that bound its length.
_COUNT_FIELDS = ("n", "best_of")
_LENGTH_FIELDS = ("max_tokens", "max_completion_tokens")


@dataclass(frozen=True)
class BodyCaps:
    """``max_n``: the most choices one line may ask for (``n``, ``best_of``); ``max_tokens``: the
    longest generation (``max_tokens``, ``max_completion_tokens``)."""

    max_n: int = DEFAULT_MAX_N
    max_tokens: int = DEFAULT_MAX_TOKENS


@functools.cache
def _models() -> dict[str, type[BaseModel]]:
    """SGLang's request model per route; imported on first use (the module takes seconds to import,
    and `sgl-blend batch` commands never validate a line)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest

    return {
        "/v1/chat/completions": ChatCompletionRequest,
        "/v1/completions": CompletionRequest,
        "/v1/embeddings": EmbeddingRequest,
    }


def validate_body(url: str, encoded: bytes, caps: BodyCaps) -> BaseModel | str:
    """The line's body, ``encoded`` as a remote worker is sent it, as SGLang's request model for
    ``url``; or why it cannot run."""
    try:
        request = _models()[url].model_validate_json(encoded)
    except ValidationError as error:
        problems = list(dict.fromkeys(_describe(problem) for problem in error.errors()))
        shown = "; ".join(problems[:_SHOWN_ERRORS])
        return shown + (f" (and {len(problems) - _SHOWN_ERRORS} more)" if len(problems) > _SHOWN_ERRORS else "")
    # Read as validated (``"2"`` is 2 by then); through the instance's fields, since reading
    # ``max_tokens`` as an attribute warns that SGLang deprecates it.
    fields = vars(request)
    for name in _COUNT_FIELDS:
        value = fields.get(name)
        if value is not None and not 1 <= value <= caps.max_n:
            return f"{name} must be from 1 to {caps.max_n} on this server, got {value}"
    for name in _LENGTH_FIELDS:
        value = fields.get(name)
        if value is not None and not 0 <= value <= caps.max_tokens:
            return f"{name} must be from 0 to {caps.max_tokens} on this server, got {value}"
    return request


def _describe(problem: ErrorDetails) -> str:
    """``messages.0.role: Field required``: the field's path without pydantic's names for the union
    members and validators it tried on the way."""
    path = ".".join(str(part) for part in problem["loc"] if not any(mark in str(part) for mark in "[(,"))
    return f"{path or 'body'}: {problem['msg']}"

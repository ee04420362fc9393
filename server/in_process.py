"""Batch lines run through SGLang's own OpenAI handlers, inside the server process.

What the ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` routes run for a
request -- the handler's validation, its conversion into SGLang's internal request, the tokenizer
manager's ``generate_request``, the response build and the error mapping -- runs here for a line
without HTTP: no request to the server's own port, no Starlette request, no connection pool on the
event loop that SGLang's tokenizer manager shares.

A line is converted once, when its batch is validated (`convert`, in the validation thread, as the
route converts in an executor thread): the conversion renders the chat template and tokenises the
prompt with SGLang's own template and tokenizer, and a completion's text prompt is tokenised here
as the tokenizer manager would, so the request the engine runs carries the very ids the plan was
made on. The conversion is kept (pickled) in the batch's prepared folder and handed to the
tokenizer manager when the line runs (`run`), with the offline routing key and the line's
placement set on it: SGLang's conversion reads the key only from an HTTP header.

A line SGLang refuses at conversion (its handler's own validation, a template error) gets the
answer the route would have given, kept in place of the conversion. `abort` cancels a line's call,
which makes SGLang release every request of it (an ``n > 1`` line's samples too, whose request ids
SGLang derives from the line's).

Lines finish in waves (every line admitted in one prefill ends in the same iteration when their
lengths agree), and each answer's response is built on the event loop that also serves the API
and online requests. So the runner calls copies of the handlers whose tokenizer manager lets at
most `ANSWERS_PER_TURN` answers through per turn of the loop (`LoopTurns`).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import pickle
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import HTTPException
from pydantic import BaseModel

from sgl_blend.batch_lines.lines import BatchLine
from sgl_blend.batch_lines.outcome import LineOutcome, aborted_outcome, answer_outcome
from sgl_blend.server.window import RankLoad
from sgl_blend.sglang_plugin import sglang_boundary as sgl

logger = logging.getLogger(__name__)
# Answers whose responses are built in one turn of the event loop: at about 150 us each on this
# host, a turn stays near 10 ms however many lines finish at once.
ANSWERS_PER_TURN = 64


@dataclass(frozen=True)
class Refusal:
    """SGLang's answer to a line it refuses before running it: the route's status and error body."""

    status: int
    body: Any


@dataclass
class Conversion:
    """What the route would hand to the tokenizer manager (``adapted``), and the OpenAI request as
    the conversion left it, which the response is built from."""

    adapted: Any
    request: BaseModel


@dataclass(frozen=True)
class Converted:
    """A line ready to run in this process: its conversion (or refusal), pickled, and the prompt
    ids the engine will run (empty for a refusal)."""

    stored: bytes
    prompt_ids: list[int]


class LoopTurns:
    """Lets at most ``per_turn`` callers through per turn of the event loop; the rest wait for the
    turns after, in order."""

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self._passed = 0
        self._waiting: deque[asyncio.Future] = deque()
        self._next_turn_due = False

    async def enter(self) -> None:
        if self._passed < self.per_turn and not self._waiting:
            self._passed += 1
            self._schedule_next_turn()
            return
        future = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        self._schedule_next_turn()
        await future

    def _schedule_next_turn(self) -> None:
        if not self._next_turn_due:
            self._next_turn_due = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._next_turn_due = False
        self._passed = 0
        while self._waiting and self._passed < self.per_turn:
            future = self._waiting.popleft()
            if not future.done():
                future.set_result(None)
                self._passed += 1
        if self._waiting or self._passed:
            self._schedule_next_turn()


class _TurnTakingTokenizerManager:
    """SGLang's tokenizer manager, its answers let through a few per loop turn (`LoopTurns`)."""

    def __init__(self, tokenizer_manager: Any, turns: LoopTurns) -> None:
        self._tokenizer_manager = tokenizer_manager
        self._turns = turns

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer_manager, name)

    async def generate_request(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for answer in self._tokenizer_manager.generate_request(*args, **kwargs):
            await self._turns.enter()
            yield answer


class InProcessEngine:
    """``handlers``: SGLang's OpenAI handler per route, as its app built them (the engine runs
    copies of them, `LoopTurns` between their tokenizer manager and their response build)."""

    def __init__(self, handlers: Mapping[str, Any], tokenizer_manager: Any) -> None:
        turns = _TurnTakingTokenizerManager(tokenizer_manager, LoopTurns(ANSWERS_PER_TURN))
        self.handlers = {url: _with_tokenizer_manager(handler, turns) for url, handler in handlers.items()}
        self.tokenizer_manager = tokenizer_manager
        self._calls: dict[str, asyncio.Task] = {}

    @classmethod
    def of_app(cls, app: Any) -> InProcessEngine:
        """The handlers SGLang's lifespan put on ``app.state`` (they exist once it has started)."""
        handlers = {}
        for url, name in sgl.SERVING_HANDLERS.items():
            handler = getattr(app.state, name, None)
            if handler is None:
                raise RuntimeError(f"SGLang's app has no {name} (the {url} handler): is its lifespan running?")
            handlers[url] = handler
        return cls(handlers, handlers["/v1/chat/completions"].tokenizer_manager)

    @property
    def stopping(self) -> bool:
        """SGLang got a SIGTERM and drains its requests: the batch runner stops and aborts its
        lines (they run again on a restart) so that the drain ends."""
        return bool(self.tokenizer_manager.gracefully_exit)

    @property
    def dp_size(self) -> int:
        return max(1, int(self.tokenizer_manager.server_args.dp_size or 1))

    # Converting, once, at validation (a worker thread)

    def convert(self, lines: Sequence[BatchLine]) -> list[Converted]:
        """Each line as its route would convert it; text prompts tokenised in one batched call."""
        conversions = [self._convert(line) for line in lines]
        self._tokenize_texts([conversion.adapted for conversion in conversions if isinstance(conversion, Conversion)])
        return [
            Converted(pickle.dumps(conversion, protocol=pickle.HIGHEST_PROTOCOL), _prompt_ids(conversion))
            for conversion in conversions
        ]

    def _convert(self, line: BatchLine) -> Conversion | Refusal:
        handler = self.handlers[line.url]
        try:
            problem = handler._validate_request(line.request)
            if problem:
                return _refusal(handler.create_error_response(problem))
            adapted, request = handler._convert_to_internal_request(line.request, None)
        except Exception as error:  # what the route's own error mapping answers
            return _refusal(_error_response(handler, error))
        return Conversion(adapted, request)

    def _tokenize_texts(self, requests: Iterable[Any]) -> None:
        """A text prompt becomes the ids the tokenizer manager would have made of it (its fast
        tokenizer on the list of prompts, special tokens added; a slow one prompt by prompt)."""
        pending = [
            adapted
            for adapted in requests
            if adapted.input_ids is None
            and adapted.text is not None
            and (isinstance(adapted.text, str) or all(isinstance(text, str) for text in adapted.text))
        ]
        texts = [
            text for adapted in pending for text in ([adapted.text] if isinstance(adapted.text, str) else adapted.text)
        ]
        if not texts:
            return
        tokenizer = self.tokenizer_manager.tokenizer
        if getattr(tokenizer, "is_fast", False):
            ids = iter(tokenizer(texts)["input_ids"])
        else:
            ids = iter([tokenizer.encode(text) for text in texts])
        for adapted in pending:
            if isinstance(adapted.text, str):
                adapted.input_ids = list(next(ids))
            else:
                adapted.input_ids = [list(next(ids)) for _text in adapted.text]
            adapted.text = None

    # Running

    async def run(
        self, url: str, custom_id: str, stored: bytes, *, rid: str, routing_key: str | None, dp_rank: int | None
    ) -> LineOutcome:
        """The line's outcome (`answer`)."""
        answer = await self.answer(url, stored, rid=rid, routing_key=routing_key, dp_rank=dp_rank)
        return aborted_outcome(custom_id) if answer is None else answer_outcome(custom_id, *answer)

    async def answer(
        self, url: str, stored: bytes, *, rid: str, routing_key: str | None, dp_rank: int | None
    ) -> tuple[int, Any] | None:
        """The route's answer to the line: its HTTP status and JSON body; None when `abort`
        cancelled the call. A cancel of the caller's own task passes through (SGLang releases the
        request either way)."""
        conversion = pickle.loads(stored)
        if isinstance(conversion, Refusal):
            return conversion.status, conversion.body
        adapted = conversion.adapted
        adapted.rid, adapted.routing_key = rid, routing_key
        if dp_rank is not None and hasattr(adapted, "routed_dp_rank"):
            adapted.routed_dp_rank = dp_rank
        adapted.received_time = sgl.monotonic_time()
        call = asyncio.ensure_future(self._answer(self.handlers[url], conversion))
        self._calls[rid] = call
        try:
            return await call
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            return None
        finally:
            self._calls.pop(rid, None)

    def abort(self, rids: Iterable[str]) -> None:
        """Stop the lines running under ``rids`` (each answers as aborted); a line already done
        needs nothing."""
        for rid in rids:
            call = self._calls.get(rid)
            if call is not None:
                call.cancel()

    @staticmethod
    async def _answer(handler: Any, conversion: Conversion) -> tuple[int, Any]:
        try:
            response = await handler._handle_non_streaming_request(conversion.adapted, conversion.request, None)
        except Exception as error:
            response = _error_response(handler, error)
        return _answer_of(response)

    async def limits(self) -> list[dict[str, Any]]:
        """Each scheduler's internal state, as ``/server_info`` lists it."""
        return await self.tokenizer_manager.get_internal_state()

    async def loads(self) -> dict[int, RankLoad]:
        """Each DP rank's queue and running batch, from the load report SGLang's schedulers
        publish every iteration (shared memory: no round trip to the scheduler)."""
        loads = await self.tokenizer_manager.get_loads(include=["core"])
        return {load.dp_rank: RankLoad(load.num_waiting_reqs, load.num_running_reqs) for load in loads}


def _with_tokenizer_manager(handler: Any, tokenizer_manager: Any) -> Any:
    clone = copy.copy(handler)
    clone.tokenizer_manager = tokenizer_manager
    return clone


def _prompt_ids(conversion: Conversion | Refusal) -> list[int]:
    """The ids the engine runs (a several-prompt completion's first), as the plan reads them."""
    if isinstance(conversion, Refusal):
        return []
    ids = conversion.adapted.input_ids
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return [int(token) for token in ids or ()]


def _error_response(handler: Any, error: Exception) -> Any:
    """The route's answer to an exception (SGLang's ``OpenAIServingBase.handle_request``)."""
    if isinstance(error, HTTPException):
        return handler.create_error_response(
            message=error.detail, err_type=str(error.status_code), status_code=error.status_code
        )
    if isinstance(error, (ValueError, sgl.DS32EncodingError)):
        return handler.create_error_response(message=str(error), err_type="BadRequest", status_code=400)
    logger.exception("a batch line failed in SGLang's handler: %s", error)
    return handler.create_error_response(
        message=f"Internal server error: {error}", err_type="InternalServerError", status_code=500
    )


def _refusal(response: Any) -> Refusal:
    return Refusal(*_answer_of(response))


def _answer_of(response: Any) -> tuple[int, Any]:
    """(status, body) of a handler's result: a response model is a 200, serialised as the route
    does (by alias); an error response carries its own status and JSON body."""
    if isinstance(response, BaseModel):
        return 200, response.model_dump(mode="json", by_alias=True)
    return int(response.status_code), orjson.loads(response.body)

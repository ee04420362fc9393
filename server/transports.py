"""How a batch runner reaches a worker's engine: in its own process, or over a remote server's line route.

- `InProcessTransport`: the server the runner lives in. A line is its conversion, handed to
  SGLang's tokenizer manager in this process (`server.in_process`).
- `StreamTransport`: another sgl-blend server. Lines go to its line route (`server.line_route`) in
  chunks -- every line the dispatcher starts in one loop step, up to `CHUNK_LINES` -- over a few
  connections, not one per line; each chunk's answer streams back one record per finished line,
  in completion order, and the remote server runs them through its own in-process path. A chunk
  whose stream breaks hands its unanswered lines back as lost answers (`AnswerLost`), which the
  worker pool tries again like any other.

Both answer the same questions: run one line (`LineCall`) to its `LineOutcome`, abort lines by
request id, and say what the worker is (its DP ranks and its schedulers' state).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from sgl_blend.batch_lines.outcome import AnswerLost, LineOutcome, WorkerUnreachable, aborted_outcome, answer_outcome
from sgl_blend.client import http
from sgl_blend.server.in_process import InProcessEngine
from sgl_blend.server.line_route import ABORT_PATH, LINES_PATH
from sgl_blend.server.prepared import PreparedLine
from sgl_blend.server.window import RankLoad

logger = logging.getLogger(__name__)
# The most lines in one chunk: big enough that a window of thousands takes a few connections, small
# enough that a chunk's connection is not kept long by its slowest line.
CHUNK_LINES = 256
PROBE_TIMEOUT_S = 10.0
# SGLang's load report: each DP rank's queue and running batch (`server.window.colocated_window`).
LOADS_PATH = "/v1/loads?include=core"


@dataclass(frozen=True)
class LineCall:
    """One try of a line: SGLang's request id for it (fresh on each try), its offline routing key
    (with its placement) and the DP rank it runs on."""

    custom_id: str
    line: PreparedLine
    rid: str
    routing_key: str
    dp_rank: int | None

    def wire(self) -> bytes:
        """The line as the line route reads it, the body's bytes spliced in as they are."""
        head = json.dumps(
            {
                "rid": self.rid,
                "custom_id": self.custom_id,
                "url": self.line.url,
                "routing_key": self.routing_key,
                "dp_rank": self.dp_rank,
            }
        )
        return head[:-1].encode() + b', "body": ' + self.line.body + b"}\n"


class Transport(Protocol):
    async def run(self, call: LineCall) -> LineOutcome: ...

    async def abort(self, rids: Iterable[str]) -> None: ...

    async def info(self) -> dict[str, Any] | None: ...

    async def loads(self) -> dict[int, RankLoad] | None: ...

    async def close(self) -> None: ...


class InProcessTransport:
    def __init__(self, engine: InProcessEngine) -> None:
        self.engine = engine

    async def run(self, call: LineCall) -> LineOutcome:
        return await self.engine.run(
            call.line.url,
            call.custom_id,
            call.line.conversion,
            rid=call.rid,
            routing_key=call.routing_key,
            dp_rank=call.dp_rank,
        )

    async def abort(self, rids: Iterable[str]) -> None:
        self.engine.abort(rids)

    async def info(self) -> dict[str, Any] | None:
        return {"dp_size": self.engine.dp_size, "internal_states": await self.engine.limits()}

    async def loads(self) -> dict[int, RankLoad] | None:
        return await self.engine.loads()

    async def close(self) -> None:
        pass


class StreamTransport:
    """``client`` carries the API key the remote server takes."""

    def __init__(
        self,
        url: str,
        client: httpx.AsyncClient,
        *,
        abort_headers: dict[str, str] | None = None,
        chunk_lines: int = CHUNK_LINES,
    ) -> None:
        self.url = url
        self.client = client
        self.chunk_lines = chunk_lines
        self._abort_headers = abort_headers or {}
        self._waiting: list[tuple[LineCall, asyncio.Future[LineOutcome]]] = []
        self._flush_due = False
        self._chunks: set[asyncio.Task] = set()

    async def run(self, call: LineCall) -> LineOutcome:
        future: asyncio.Future[LineOutcome] = asyncio.get_running_loop().create_future()
        self._waiting.append((call, future))
        if len(self._waiting) >= self.chunk_lines:
            self._flush()
        elif not self._flush_due:
            self._flush_due = True
            asyncio.get_running_loop().call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        """Send what is waiting: the lines started in this loop step go together."""
        self._flush_due = False
        while self._waiting:
            chunk, self._waiting = self._waiting[: self.chunk_lines], self._waiting[self.chunk_lines :]
            task = asyncio.create_task(self._send(chunk))
            self._chunks.add(task)
            task.add_done_callback(self._chunks.discard)

    async def _send(self, chunk: list[tuple[LineCall, asyncio.Future[LineOutcome]]]) -> None:
        waiting = {call.rid: (call, future) for call, future in chunk if not future.done()}
        if not waiting:
            return
        content = b"".join(call.wire() for call, _future in waiting.values())
        try:
            async with self.client.stream(
                "POST", self.url + LINES_PATH, content=content, headers={"Content-Type": "application/x-ndjson"}
            ) as response:
                if response.status_code != 200:
                    answer = _json_or_text(await response.aread())
                    for call, future in waiting.values():
                        _settle(future, answer_outcome(call.custom_id, response.status_code, answer))
                    return
                async for text in response.aiter_lines():
                    if text:
                        self._answered(waiting, json.loads(text))
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            lost: Exception = WorkerUnreachable(f"{self.url}: {type(error).__name__}: {error}")
        except (http.NoAnswer, ValueError, KeyError) as error:
            lost = AnswerLost(f"{self.url}: the line stream broke: {type(error).__name__}: {error}")
        else:
            lost = AnswerLost(f"{self.url}: the line stream ended without these lines' answers")
        for _call, future in waiting.values():
            if not future.done():
                future.set_exception(lost)

    @staticmethod
    def _answered(waiting: dict[str, tuple[LineCall, asyncio.Future[LineOutcome]]], record: dict[str, Any]) -> None:
        entry = waiting.pop(record["rid"], None)
        if entry is None:
            return
        call, future = entry
        _settle(
            future,
            aborted_outcome(call.custom_id)
            if record.get("aborted")
            else answer_outcome(call.custom_id, int(record["status"]), record["body"]),
        )

    async def abort(self, rids: Iterable[str]) -> None:
        """Abort lines the remote server is running (each answers as aborted); a server that cannot
        be reached has them end with their stream."""
        try:
            await self.client.post(
                self.url + ABORT_PATH, json={"rids": list(rids)}, headers=self._abort_headers, timeout=PROBE_TIMEOUT_S
            )
        except http.NoAnswer:
            pass

    async def info(self) -> dict[str, Any] | None:
        try:
            return await http.server_info_async(self.client, self.url, timeout=PROBE_TIMEOUT_S)
        except (http.NoAnswer, httpx.HTTPStatusError, ValueError):
            return None

    async def loads(self) -> dict[int, RankLoad] | None:
        """From SGLang's ``/v1/loads`` (None: the server did not answer it)."""
        try:
            response = await self.client.get(self.url + LOADS_PATH, timeout=PROBE_TIMEOUT_S)
            response.raise_for_status()
            return {
                int(load["dp_rank"]): RankLoad(int(load["num_waiting_reqs"]), int(load["num_running_reqs"]))
                for load in response.json()["loads"]
            }
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    async def close(self) -> None:
        for task in list(self._chunks):
            task.cancel()
        await asyncio.gather(*self._chunks, return_exceptions=True)


def _settle(future: asyncio.Future[LineOutcome], outcome: LineOutcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _json_or_text(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return {"error": {"message": data[:2000].decode(errors="replace")}}

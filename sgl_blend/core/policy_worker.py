"""The offline policy one step ahead of the engine, outside the loop that runs the batches (HyGen A.1).

An engine iteration must not pay for planning offline work: a policy's plan walks its whole
pending set (thousands of queued lines), and a loop that plans before every batch makes every
online request wait for it. So the engine only reports what happened -- arrivals, admissions,
progress, completions, the free KV -- as `Event`s, one message per iteration, and reads the
latest `Proposal` the worker has answered with, never waiting for it. The worker applies the
events to the policy in order and proposes for the next step; when the engine runs faster than
the worker plans, several iterations' events are applied before one proposal, and the engine
keeps admitting from the proposal it has.

Three ways to run the worker, one `PolicyWorker` behind each (`make_link`):

- ``process`` (the default): a child process; the loop pays a pickled message per iteration and
  never shares a lock with the planner.
- ``thread``: a thread of the engine's process; the planner takes turns with the loop for the GIL.
- ``inline``: no worker; each proposal is made when the engine asks for it, on its own time
  (deterministic: what the tests of the policy's decisions and the simulator use).

No SGLang import: the plugin and the simulator drive the same worker.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import select
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from sgl_blend.core.policy_log import RecordedPolicy
from sgl_blend.core.protocol import AdmissionPolicy

WORKER_KINDS = ("process", "thread", "inline")

# An event: (kind, *arguments), kind one of the `AdmissionPolicy` calls below or "propose".
Event = tuple[Any, ...]
EVENT_CALLS = frozenset(
    {"submit", "admitted", "prefill_continues", "progress", "preempted", "finished", "withdraw", "advance"}
)


class Proposed(NamedTuple):
    """One request of a proposal: its rid, the scan side it would be admitted from, and what the
    radix cache records on its path when it is (`AdmissionPolicy.annotation`). A tuple, not a
    frozen dataclass: the engine unpickles hundreds of them an iteration, and a frozen slotted
    dataclass's setstate took 8% of the scheduler's time (py-spy, HyGen, 3,000-line backlog)."""

    rid: str
    side: str | None
    annotation: tuple[float, int] | None


@dataclass(frozen=True)
class Proposal:
    """The worker's answer to the events up to ``seen`` (the count of messages it had applied):
    the requests to admit, in order, and the prefill budget of the next iteration."""

    seen: int
    requests: tuple[Proposed, ...] = ()
    prefill_budget: int | None = None
    plan_seconds: float = 0.0


class PolicyWorker:
    """Applies events to one policy and proposes. ``record_calls`` keeps every call on the policy
    (`RecordedPolicy`), for replaying a run through a fresh policy."""

    def __init__(self, policy: AdmissionPolicy, kv_capacity: int, record_calls: bool = False) -> None:
        self.policy: AdmissionPolicy = RecordedPolicy(policy) if record_calls else policy
        self.policy.set_kv_capacity(kv_capacity)
        self.seen = 0
        self.plan_seconds = 0.0

    def apply(self, events: Sequence[Event]) -> tuple[int, int] | None:
        """Apply one message's events; the last ``propose`` request's (free KV, most requests)."""
        self.seen += 1
        asked = None
        policy = self.policy
        for event in events:
            kind = event[0]
            if kind == "propose":
                asked = (event[1], event[2])
            elif kind in EVENT_CALLS:
                getattr(policy, kind)(*event[1:])
            else:
                raise ValueError(f"unknown policy event {kind!r}")
        return asked

    def propose(self, free_kv_tokens: int, max_requests: int) -> Proposal:
        started = time.perf_counter()
        policy = self.policy
        requests = policy.propose(free_kv_tokens, max_requests)
        budget = policy.prefill_token_budget()
        proposed = tuple(
            Proposed(request.rid, policy.admission_side(request.rid), policy.annotation(request.rid))
            for request in requests
        )
        self.plan_seconds += time.perf_counter() - started
        return Proposal(self.seen, proposed, budget, self.plan_seconds)

    def recorded_calls(self) -> list[Any] | None:
        return self.policy.events if isinstance(self.policy, RecordedPolicy) else None


PolicyFactory = Callable[[], AdmissionPolicy]


class PolicyLink(Protocol):
    """How the engine reaches its `PolicyWorker`."""

    kind: str

    def send(self, events: list[Event]) -> None:
        """One iteration's events (ending with a ``propose`` request when it wants a proposal)."""

    def latest(self) -> Proposal | None:
        """The newest proposal answered since the last call (None: nothing new); never waits."""

    def recorded_calls(self) -> list[Any] | None:
        """The policy's recorded calls (rare: waits for the worker)."""

    def close(self) -> None: ...


class InlineLink:
    """The worker in the caller's own thread: events are applied as they are sent, and a proposal
    is made when ``latest`` is asked after a ``propose`` request."""

    kind = "inline"

    def __init__(self, factory: PolicyFactory, kv_capacity: int, record_calls: bool = False) -> None:
        self.worker = PolicyWorker(factory(), kv_capacity, record_calls)
        self._asked: tuple[int, int] | None = None

    def send(self, events: list[Event]) -> None:
        self._asked = self.worker.apply(events) or self._asked

    def latest(self) -> Proposal | None:
        asked, self._asked = self._asked, None
        return self.worker.propose(*asked) if asked is not None else None

    def recorded_calls(self) -> list[Any] | None:
        return self.worker.recorded_calls()

    def close(self) -> None:
        pass


# The most messages applied before a proposal: an engine that sends faster than the worker reads
# still gets answers.
MAX_DRAIN = 64


def _serve(worker: PolicyWorker, receive: Callable[[float | None], Any], answer: Callable[[Any], None]) -> None:
    """The worker's loop: wait for a message, apply every message that has come meanwhile (up to
    `MAX_DRAIN`), then answer the last ``propose`` request among them. ``None`` ends it;
    ``"calls"`` asks for the recorded calls."""
    while True:
        messages = [receive(None)]
        while len(messages) < MAX_DRAIN and (more := receive(0.0)) is not _EMPTY:
            messages.append(more)
        asked = None
        for message in messages:
            if message is None:
                return
            if message == "calls":
                answer(("calls", worker.recorded_calls()))
                continue
            asked = worker.apply(message) or asked
        if asked is not None:
            answer(worker.propose(*asked))


_EMPTY = object()


def _is_calls(answer: Any) -> bool:
    return isinstance(answer, tuple) and bool(answer) and answer[0] == "calls"


class _WorkerLink(ABC):
    """A worker answering on its own time: messages go into ``_inbox``; subclasses say whether an
    answer is ready and read one."""

    _inbox: Any

    def __init__(self) -> None:
        self._newest: Proposal | None = None

    @abstractmethod
    def _answer_ready(self) -> bool: ...

    @abstractmethod
    def _answer(self) -> Any: ...

    def send(self, events: list[Event]) -> None:
        self._inbox.put(events)

    def latest(self) -> Proposal | None:
        while self._answer_ready():
            self._newest = self._answer()
        newest, self._newest = self._newest, None
        return newest

    def recorded_calls(self) -> list[Any] | None:
        self._inbox.put("calls")
        while not _is_calls(answer := self._answer()):
            self._newest = answer
        return answer[1]


class ThreadLink(_WorkerLink):
    kind = "thread"

    def __init__(self, factory: PolicyFactory, kv_capacity: int, record_calls: bool = False) -> None:
        super().__init__()
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        worker = PolicyWorker(factory(), kv_capacity, record_calls)
        self._thread = threading.Thread(
            target=_serve, args=(worker, self._receive, self._outbox.put), name="sgl-blend-policy", daemon=True
        )
        self._thread.start()

    def _receive(self, timeout: float | None) -> Any:
        if timeout is None:
            return self._inbox.get()
        try:
            return self._inbox.get_nowait()
        except queue.Empty:
            return _EMPTY

    def _answer_ready(self) -> bool:
        return not self._outbox.empty()

    def _answer(self) -> Any:
        return self._outbox.get()

    def close(self) -> None:
        self._inbox.put(None)


# How often a waiting worker process checks that the engine's process is still there.
PARENT_CHECK_S = 1.0


_FRAME = struct.Struct("!I")


def _write_frames(fd: int) -> Callable[[Any], None]:
    """Answers written to the engine as length-prefixed pickles on a raw pipe, which the engine
    reads without blocking and without building a selector per look (`ProcessLink.latest`)."""

    def write(answer: Any) -> None:
        payload = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(_FRAME.pack(len(payload)) + payload)
        while view:
            view = view[os.write(fd, view) :]

    return write


def _process_main(factory: PolicyFactory, kv_capacity: int, record_calls: bool, inbox: Any, outbox: Any) -> None:
    """The child's entry: serve until the engine says stop or its process is gone."""
    parent = multiprocessing.parent_process()

    def receive(timeout: float | None) -> Any:
        while True:
            try:
                return inbox.get(timeout=PARENT_CHECK_S) if timeout is None else inbox.get_nowait()
            except queue.Empty:
                if timeout is not None:
                    return _EMPTY
                if parent is not None and not parent.is_alive():
                    return None

    try:
        _serve(PolicyWorker(factory(), kv_capacity, record_calls), receive, _write_frames(outbox.fileno()))
    except (BrokenPipeError, EOFError, OSError):
        pass


class ProcessLink(_WorkerLink):
    """Events go through a `multiprocessing` queue, whose feeder thread writes them, so a worker
    busy with a long plan never blocks the engine's send; answers come back as frames on a pipe
    the engine reads without blocking."""

    kind = "process"

    def __init__(self, factory: PolicyFactory, kv_capacity: int, record_calls: bool = False) -> None:
        super().__init__()
        context = multiprocessing.get_context("spawn")
        self._inbox = context.Queue()
        self._answers, outbox = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_process_main,
            args=(factory, kv_capacity, record_calls, self._inbox, outbox),
            name="sgl-blend-policy",
            daemon=True,
        )
        self._process.start()
        outbox.close()
        self._fd = self._answers.fileno()
        os.set_blocking(self._fd, False)
        self._buffer = bytearray()
        self._ready: deque[Any] = deque()

    def _read(self) -> None:
        """Take what the worker has written; complete answers join ``_ready``."""
        while True:
            try:
                chunk = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                raise EOFError("the policy worker is gone")
            self._buffer += chunk
        while len(self._buffer) >= _FRAME.size:
            (size,) = _FRAME.unpack_from(self._buffer)
            if len(self._buffer) < _FRAME.size + size:
                break
            self._ready.append(pickle.loads(self._buffer[_FRAME.size : _FRAME.size + size]))
            del self._buffer[: _FRAME.size + size]

    def _answer_ready(self) -> bool:
        if not self._ready:
            self._read()
        return bool(self._ready)

    def _answer(self) -> Any:
        while not self._answer_ready():
            select.select([self._fd], [], [])
        return self._ready.popleft()

    def close(self) -> None:
        self._inbox.put(None)
        self._process.join(timeout=5)
        if self._process.is_alive():
            self._process.kill()


def make_link(kind: str, factory: PolicyFactory, kv_capacity: int, record_calls: bool = False) -> PolicyLink:
    links: dict[str, Callable[..., PolicyLink]] = {"process": ProcessLink, "thread": ThreadLink, "inline": InlineLink}
    if kind not in links:
        raise ValueError(f"unknown policy worker {kind!r}; known: {', '.join(WORKER_KINDS)}")
    return links[kind](factory, kv_capacity, record_calls)

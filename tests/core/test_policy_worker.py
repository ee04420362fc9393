"""The offline policy in its worker, one step ahead of the engine: what the engine sends it and what
it answers, through each link (a child process, a thread, or inline in the engine's own thread)."""

from __future__ import annotations

import functools
import subprocess
import sys
import time

import psutil

import pytest

from sgl_blend.core.cost_model import BUILTIN_MODELS, HardwareSpec
from sgl_blend.core.policies import make_policy
from sgl_blend.core.policy_log import replay
from sgl_blend.core.policy_worker import WORKER_KINDS, Proposal, make_link
from tests.core.test_policies import workload

CAPACITY = 20_000
ITERATION_S = 0.0005
FACTORY = functools.partial(
    make_policy, "blendserve", BUILTIN_MODELS["llama-3.1-8b"], HardwareSpec.resolve("h100-sxm"), sample_rate=0.05
)


def wait_for(link, deadline_s: float = 30.0) -> Proposal:
    """The next proposal (a worker answers asynchronously; inline at once)."""
    ends = time.monotonic() + deadline_s
    while time.monotonic() < ends:
        proposal = link.latest()
        if proposal is not None:
            return proposal
        time.sleep(0.001)
    raise AssertionError("the worker never answered")


def drive(kind: str, lag: int) -> tuple[list[str], list[list]]:
    """A tiny engine that admits from whatever proposal it last got, reading a new one only every
    ``lag`` iterations (0: waits for the answer to each iteration's message), as an engine does
    whose worker plans slower than it runs; each iteration then takes half a millisecond, about
    what SGLang's loop takes on this CPU, so that the worker is behind but answers. Returns the
    admission order and the recorded calls."""
    requests = workload(300)
    link = make_link(kind, FACTORY, CAPACITY, record_calls=True)
    try:
        lengths = {request.rid: (len(request.prompt_ids), min(request.max_new_tokens, 6)) for request in requests}
        events: list[tuple] = [("submit", requests)]
        running: dict[str, int] = {}
        admitted: list[str] = []
        proposal: list[str] = []
        finished = 0
        step = 0
        while finished < len(requests):
            step += 1
            assert step < 20_000, "the engine stopped making progress"
            used = sum(lengths[rid][0] + done for rid, done in running.items())
            link.send([*events, ("propose", max(CAPACITY - used, 0), 32)])
            events = []
            if lag == 0:
                proposal = [entry.rid for entry in wait_for(link).requests]
            else:
                time.sleep(ITERATION_S)
                if step % lag == 0 and (answer := link.latest()) is not None:
                    proposal = [entry.rid for entry in answer.requests]
            taken = [rid for rid in proposal if rid not in running and rid not in admitted][:8]
            proposal = [rid for rid in proposal if rid not in taken]
            if taken:
                events.append(("admitted", taken))
                admitted += taken
                running.update(dict.fromkeys(taken, 0))
            events.append(("advance", 1))
            for rid in list(running):
                running[rid] += 1
                if running[rid] >= lengths[rid][1]:
                    events.append(("finished", rid, running.pop(rid)))
                    finished += 1
        calls = link.recorded_calls()
        assert calls is not None
        return admitted, calls
    finally:
        link.close()


@pytest.mark.parametrize("kind", WORKER_KINDS)
def test_every_request_is_admitted_once_through_each_worker(kind: str) -> None:
    admitted, calls = drive(kind, lag=0)
    assert sorted(admitted) == sorted(request.rid for request in workload(300))
    assert replay(calls, FACTORY()) == []


def test_the_three_workers_make_the_same_decisions_when_the_engine_waits_for_them() -> None:
    orders = {kind: drive(kind, lag=0)[0] for kind in WORKER_KINDS}
    assert orders["process"] == orders["inline"] == orders["thread"]


def test_an_engine_that_reads_proposals_late_still_admits_each_request_once() -> None:
    admitted, calls = drive("process", lag=5)
    assert sorted(admitted) == sorted(request.rid for request in workload(300))
    assert replay(calls, FACTORY()) == [], "the worker's own record replays to its decisions"


ORPHAN = """
import functools, sys, time
from sgl_blend.core.cost_model import BUILTIN_MODELS, HardwareSpec
from sgl_blend.core.policies import make_policy
from sgl_blend.core.policy_worker import make_link
factory = functools.partial(make_policy, "dfs", BUILTIN_MODELS["llama-3.1-8b"], HardwareSpec.resolve("h100-sxm"))
link = make_link("process", factory, 1000)
print(link._process.pid, flush=True)
time.sleep(600)
"""


def test_a_worker_whose_engine_was_killed_exits() -> None:
    """kill -9 of the scheduler's process leaves no planner behind."""
    engine = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout is not None
        worker = int(engine.stdout.readline())
        assert psutil.pid_exists(worker)
    finally:
        engine.kill()
        engine.wait()
    gone = psutil.wait_procs([psutil.Process(worker)], timeout=20)[0] if psutil.pid_exists(worker) else [worker]
    assert gone, "the worker outlived its engine"

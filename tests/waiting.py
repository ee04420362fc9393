"""Waiting for a state the system exposes, never for a length of time.

`wait_for` polls a condition until it holds and returns what it returned; its limit is a guard
against a hung server, not a speed target (every condition here comes true in seconds)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, TypeVar

T = TypeVar("T")
WAIT_LIMIT_S = 600.0


def wait_for(condition: Callable[[], T], what: str, *, timeout_s: float = WAIT_LIMIT_S, poll_s: float = 0.1) -> T:
    """The first truthy value of ``condition()``; fails, saying ``what`` was awaited, after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"still waiting after {timeout_s:.0f} s for {what}; last seen: {value!r}")
        time.sleep(poll_s)


async def wait_for_async(condition: Callable[[], T | Awaitable[T]], what: str, *, timeout_s: float = WAIT_LIMIT_S,
                         poll_s: float = 0.05) -> T:
    """`wait_for` inside an event loop (a runner under test keeps running between the polls)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"still waiting after {timeout_s:.0f} s for {what}; last seen: {value!r}")
        await asyncio.sleep(poll_s)

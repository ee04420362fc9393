"""The plugin's one rule: an error inside the scheduler must never take it down.

Each part of the plugin (the offline pool, the iteration record, a co-location mode's state) is
an attribute of the object that owns it, None once it is off. A guarded step runs only while its
part is live; on an exception the part is switched off (logged once, with the traceback, since
the step never runs again) and the step returns its fallback, so SGLang goes on scheduling
everything its own way.

What was switched off is kept (`SWITCHED_OFF`) and shown in ``/server_info``: a policy that
stops scheduling leaves a server that still answers, and a benchmark would otherwise report
SGLang's figures as the policy's.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
Step = TypeVar("Step", bound=Callable[..., Any])
Part = TypeVar("Part")
# "Owner.part" for every part switched off in this process, in order.
SWITCHED_OFF: list[str] = []


def switch_off(owner: Any, part: str, message: str) -> None:
    """Inside an ``except``: log the error with its traceback, switch ``owner.<part>`` off and
    remember it."""
    logger.exception(message)
    setattr(owner, part, None)
    SWITCHED_OFF.append(f"{type(owner).__name__}.{part}")


def guarded(part: str, message: str, fallback: Any = None) -> Callable[[Step], Step]:
    """Guard a method that works on ``self.<part>``."""

    def wrap(step: Step) -> Step:
        @functools.wraps(step)
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self, part) is None:
                return fallback
            try:
                return step(self, *args, **kwargs)
            except Exception:
                switch_off(self, part, message)
                return fallback

        return run  # type: ignore[return-value]

    return wrap


def live(part: Part | None) -> Part:
    """A part inside a step guarded on it, which runs only while the part is set. (A step that
    reads another part that has failed raises here, and its own guard switches it off too.)"""
    assert part is not None, "a guarded step runs only while its part is live"
    return part

"""The plugin's one rule: an error inside the scheduler must never take it down.

A guarded step runs only while its part of the plugin is active; on an exception the part is
switched off (logged once, with the traceback) and the step returns its fallback, so SGLang goes on
scheduling everything its own way.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


def guard(active: Callable[[], Any], disable: Callable[[], None], message: str,
          fallback: Any = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(step: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            if active() is None:
                return fallback
            try:
                return step(*args, **kwargs)
            except Exception:
                logger.exception(message)
                disable()
                return fallback

        return run

    return wrap

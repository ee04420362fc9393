"""The scheduler checks that it runs the prompt the plan was made on.

A batch line is planned on prompt ids its runner read once, at validation, and run as a request
the engine tokenised from the same conversion; nothing else ties the two. So a planned line's
placement carries the digest of its plan's ids (`core.placement.prompt_digest`), and each offline
request that arrives with one is checked against the ids the scheduler will run
(``origin_input_ids``). A mismatch means the plan ordered and placed a prompt other than the one
that runs: it is counted (``/server_info``: ``sgl_blend.prompt_ids``) and logged.
"""

from __future__ import annotations

import logging
from typing import Any

from sgl_blend.core.placement import prompt_digest
from sgl_blend.offline import placement_of

logger = logging.getLogger(__name__)


class PromptCheck:
    def __init__(self) -> None:
        self.checked = 0
        self.mismatched = 0

    def arrived(self, req: Any) -> None:
        placement = placement_of(req.routing_key)
        if placement is None or placement.prompt is None:
            return
        self.checked += 1
        if prompt_digest(req.origin_input_ids) != placement.prompt:
            self.mismatched += 1
            logger.warning(
                "offline request %s runs %d prompt tokens other than those its plan was made on",
                req.rid,
                len(req.origin_input_ids),
            )

    def snapshot(self) -> dict[str, int]:
        return {"checked": self.checked, "mismatched": self.mismatched}

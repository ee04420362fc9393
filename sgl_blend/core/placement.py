"""A request's place in a batch's global plan, as the planner outside the engine decided it.

BlendServe plans the whole batch (paper §4): the tree over every request, its density order and
the cut between the compute and the memory side. The engine's scheduler only ever holds a small
window of that batch, so it must not plan again from its partial view; each request therefore
arrives carrying its placement, and the scheduler's pool admits by it. The text form travels in
the request's routing key (see `sgl_blend.offline`).
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

SAMPLE = "sample"
COMPUTE = "compute"
MEMORY = "memory"
_CODES = {SAMPLE: "s", COMPUTE: "c", MEMORY: "m"}
_SIDES = {code: side for side, code in _CODES.items()}
# Between a placement's fields and the digest of the prompt ids it was planned on.
PROMPT_SEPARATOR = "/"


@dataclass(frozen=True, slots=True)
class Placement:
    """``side``: the scan side (or the output-length sample run first); ``position``: the
    request's index in the global plan order (a memory side is scanned from its highest position
    down); ``density``: compute over memory time planned for it; ``output``: the output length
    the plan assumed; ``after``: how many requests of its side the plan scans after it (None for a
    sample). The scheduler holds only a window of the plan; from the front request of each side
    it knows how much of that side is still to come, which its memory partition needs.
    ``prompt``: the digest of the prompt ids the plan saw (`prompt_digest`), which the scheduler
    checks against the ids it runs."""

    side: str
    position: int
    density: float
    output: int
    after: int | None = None
    prompt: str | None = None

    def encode(self) -> str:
        text = f"{_CODES[self.side]}{self.position}:{self.density:.4g}:{self.output}"
        text = text if self.after is None else f"{text}:{self.after}"
        return text if self.prompt is None else f"{text}{PROMPT_SEPARATOR}{self.prompt}"

    @classmethod
    def decode(cls, text: str) -> Placement | None:
        """The placement ``encode`` wrote, or None for anything else (a client's own key)."""
        try:
            fields, _, prompt = text.partition(PROMPT_SEPARATOR)
            head, density, output, *after = fields.split(":")
            if len(after) > 1:
                return None
            return cls(
                _SIDES[head[0]],
                int(head[1:]),
                float(density),
                int(output),
                int(after[0]) if after else None,
                prompt or None,
            )
        except (KeyError, ValueError, IndexError):
            return None


def prompt_digest(token_ids: Iterable[int]) -> str:
    """A short digest of prompt token ids: the plan's (a line's placement carries it) and the
    engine's (``origin_input_ids``) must agree."""
    return hashlib.blake2b(array("q", token_ids).tobytes(), digest_size=6).hexdigest()

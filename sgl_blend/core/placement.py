"""A request's place in a batch's global plan, as the planner outside the engine decided it.

BlendServe plans the whole batch (paper §4): the tree over every request, its density order and
the cut between the compute and the memory side. The engine's scheduler only ever holds a small
window of that batch, so it must not plan again from its partial view; each request therefore
arrives carrying its placement, and the scheduler's pool admits by it. The text form travels in
the request's routing key (see `sgl_blend.offline`).
"""

from __future__ import annotations

from dataclasses import dataclass

SAMPLE = "sample"
COMPUTE = "compute"
MEMORY = "memory"
_CODES = {SAMPLE: "s", COMPUTE: "c", MEMORY: "m"}
_SIDES = {code: side for side, code in _CODES.items()}


@dataclass(frozen=True, slots=True)
class Placement:
    """``side``: the scan side (or the output-length sample run first); ``position``: the
    request's index in the global plan order (a memory side is scanned from its highest position
    down); ``density``: compute over memory time planned for it; ``output``: the output length
    the plan assumed."""

    side: str
    position: int
    density: float
    output: int

    def encode(self) -> str:
        return f"{_CODES[self.side]}{self.position}:{self.density:.4g}:{self.output}"

    @classmethod
    def decode(cls, text: str) -> Placement | None:
        """The placement ``encode`` wrote, or None for anything else (a client's own key)."""
        try:
            head, density, output = text.split(":")
            return cls(_SIDES[head[0]], int(head[1:]), float(density), int(output))
        except (KeyError, ValueError, IndexError):
            return None

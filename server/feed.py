"""The lines a runner will send, per slot, in the order it sends them.

One queue per slot (a worker's DP rank) over every batch the runner holds: the runner's plan (or
file order, for the orderings that do not plan) decides the order, and the dispatcher takes each
slot's next line whenever that slot's window has room. A line is queued once, sent once (put back
at the front only when its worker gave no answer), and leaves the feed when it is sent. Every
queued line keeps its placement, which travels with it to the engine.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from sgl_blend.core.placement import Placement

if TYPE_CHECKING:
    from sgl_blend.server.assignment import Slot

LineKey = tuple[str, int]  # (batch id, line number)


class Feed:
    def __init__(self) -> None:
        self._queues: dict[Slot, deque[LineKey]] = {}
        self._slot: dict[LineKey, Slot] = {}
        self.placements: dict[LineKey, Placement] = {}

    def __len__(self) -> int:
        return len(self._slot)

    def __contains__(self, key: LineKey) -> bool:
        return key in self._slot

    def queued(self) -> Iterator[LineKey]:
        """Every queued line, slot by slot, each slot's in sending order."""
        for queue in self._queues.values():
            yield from queue

    def slots_with_lines(self) -> set[Slot]:
        return {slot for slot, queue in self._queues.items() if queue}

    def slot_of(self, key: LineKey) -> Slot:
        return self._slot[key]

    def append(
        self,
        keys: Iterable[LineKey],
        slot_of: Mapping[LineKey, Slot],
        placements: Mapping[LineKey, Placement] | None = None,
    ) -> None:
        """Queue lines after those already queued."""
        for key in keys:
            self._enqueue(key, slot_of[key])
        self.placements.update(placements or {})

    def push_front(
        self,
        keys: Iterable[LineKey],
        slot_of: Mapping[LineKey, Slot],
        placements: Mapping[LineKey, Placement] | None = None,
    ) -> None:
        """Queue lines before everything queued (output-length samples; a line that was not answered)."""
        for key in reversed(list(keys)):
            self._enqueue(key, slot_of[key], front=True)
        self.placements.update(placements or {})

    def replace(
        self, order: list[LineKey], slot_of: Mapping[LineKey, Slot], placements: Mapping[LineKey, Placement]
    ) -> None:
        """Queue ``order`` (a new plan's lines that are still to send: queued ones and new ones)
        in that order, behind the lines it does not cover (samples, lines that arrived while the
        plan was made), which keep their place."""
        covered = set(order)
        for slot, queue in self._queues.items():
            self._queues[slot] = deque(key for key in queue if key not in covered)
        for key in covered & self._slot.keys():
            del self._slot[key]
        for key in order:
            self._enqueue(key, slot_of[key])
        self.placements.update((key, placements[key]) for key in order if key in placements)

    def pop(self, slot: Slot) -> LineKey | None:
        queue = self._queues.get(slot)
        if not queue:
            return None
        key = queue.popleft()
        del self._slot[key]
        return key

    def take_placement(self, key: LineKey) -> Placement | None:
        return self.placements.pop(key, None)

    def remove_batch(self, batch_id: str) -> None:
        for slot, queue in self._queues.items():
            self._queues[slot] = deque(key for key in queue if key[0] != batch_id)
        for key in [key for key in self._slot if key[0] == batch_id]:
            del self._slot[key]
            self.placements.pop(key, None)

    def move_slots(self, gone: set[Slot], slot_of: Mapping[LineKey, Slot]) -> None:
        """Requeue the lines of slots that are gone on the slots ``slot_of`` gives them, in order."""
        for slot in gone:
            for key in self._queues.pop(slot, deque()):
                del self._slot[key]
                self._enqueue(key, slot_of[key])

    def _enqueue(self, key: LineKey, slot: Slot, front: bool = False) -> None:
        if key in self._slot:
            return
        queue = self._queues.setdefault(slot, deque())
        queue.appendleft(key) if front else queue.append(key)
        self._slot[key] = slot

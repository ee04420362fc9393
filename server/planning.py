"""What a runner feeds next: one global plan over the unsent lines of every batch it holds (BlendServe §4),
made while the engine already has work.

Validation hands lines over a chunk at a time, each tokenised once. The engine must never wait
while lines remain, so nothing waits for the whole batch:

- output-length samples (a seeded 1% of the lines whose length is not fixed, when the plan blends)
  are fed the moment they are validated, ahead of everything;
- while batches are still being validated, what has been validated is planned and fed by that
  provisional plan -- at doubling sizes, and whenever the queue runs dry -- so the engine gets the
  first lines of both sides of it;
- once every batch is validated, every unsent line of every batch is planned together, and again
  when every sample is back (their lengths refine the estimates; a sample never holds anything
  up) or another batch joins. A joining batch's lines were tokenised once, when it was validated;
  the lines already planned keep their prompts.

Plans run in a worker thread, off the event loop; a plan covers the lines that were unsent when it
began and reorders only those still unsent when it ends. All plans share one rank space
(`RankSpace`), and each line's rank and placement are written to the store, so a restarted runner
feeds by the last plan without planning again. Runners that do not plan (SGLang's own orders, the
plugin's arrival order) feed lines in file order as they are validated.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sgl_blend.batch_lines.outcome import LineOutcome
from sgl_blend.batch_lines.plan import LinePlanner, RankSpace
from sgl_blend.core.batch_plan import BatchPlan
from sgl_blend.core.dp_shares import WorkItem
from sgl_blend.core.output_length import DEFAULT_FALLBACK, DEFAULT_SAMPLE_RATE
from sgl_blend.core.placement import SAMPLE, Placement, prompt_digest
from sgl_blend.server.feed import Feed, LineKey
from sgl_blend.server.window import line_footprint

if TYPE_CHECKING:
    from sgl_blend.server.assignment import Slot
    from sgl_blend.server.store import BatchStore

logger = logging.getLogger(__name__)
# The first provisional plan waits for this many validated lines (one validation chunk), unless
# the queue runs dry first.
FIRST_PROVISIONAL_LINES = 1024

SlotChooser = Callable[[Sequence[LineKey], Mapping[LineKey, WorkItem]], dict[LineKey, "Slot"]]


@dataclass
class PlanRecord:
    """One plan, for the runner's log and the tests: the lines it covered, whether batches were
    still being validated when it began (a provisional plan), the samples it knew the lengths of,
    and the first of the store ranks its lines got (every plan's ranks follow the earlier ones')."""

    lines: int
    provisional: bool
    observed_samples: int
    first_rank: int


class PlanKeeper:
    """Keeps the runner's one plan current as lines come and go, and the feed in its order; the
    plans themselves are the ``line_planner``'s (`batch_lines.plan.LinePlanner`, over the core's
    `TreePlanner`). ``line_planner`` None: no plan, file order. ``choose_slots`` spreads lines
    over the live slots (by their prompts where it can)."""

    def __init__(
        self,
        feed: Feed,
        line_planner: LinePlanner | None,
        store: BatchStore,
        owner: str,
        choose_slots: SlotChooser,
        wake: Callable[[], None],
    ) -> None:
        self.feed = feed
        self.line_planner = line_planner
        self.store = store
        self.owner = owner
        self.choose_slots = choose_slots
        self.wake = wake
        self.ranks = RankSpace()
        # One plan at a time, in a thread of its own: not behind a batch being read, nor in the
        # event loop's default executor, which SGLang and the API's store reads share.
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-plan")
        # Plans place their lines in a worker thread while samples take positions on the loop.
        self._ranks_lock = threading.Lock()
        self.items: dict[LineKey, WorkItem] = {}
        self.unplanned: dict[LineKey, None] = {}
        self.samples: set[LineKey] = set()
        self.observed: dict[LineKey, tuple[WorkItem, int]] = {}
        self.plans: list[PlanRecord] = []
        self._task: asyncio.Task | None = None
        self._observed_at_last_plan = 0
        self._last_plan_lines = 0
        self._next_rank = 0
        self._footprint = [0.0, 0]

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    @property
    def mean_footprint(self) -> float | None:
        """The mean KV tokens a line holds over its life (prompt plus half its output bound), over
        every line with a prompt so far; None before the first."""
        total, count = self._footprint
        return total / count if count else None

    @property
    def planning(self) -> bool:
        return self._task is not None and not self._task.done()

    # Lines coming in

    def add(self, batch_id: str, numbers: Sequence[int], items: Mapping[int, WorkItem]) -> None:
        """Lines of a batch that are ready to run (validated now, or unfinished at a restart),
        in file order, with the prompts that were tokenised."""
        keys = self._remember(batch_id, numbers, items)
        if self.line_planner is None:
            self.feed.append(keys, self.choose_slots(keys, self.items))
            return
        samples = [key for key in keys if self._is_sample(key)]
        if samples:
            self.samples.update(samples)
            self.feed.push_front(
                samples, self.choose_slots(samples, self.items), {key: self._sample_placement(key) for key in samples}
            )
        self.unplanned.update((key, None) for key in keys if key not in self.samples)

    def resume(
        self,
        batch_id: str,
        planned: Sequence[tuple[int, Placement]],
        unplanned: Sequence[int],
        items: Mapping[int, WorkItem],
        slot_of: Mapping[LineKey, Slot],
    ) -> None:
        """A batch taken up again with a stored plan: its planned lines in their stored order and
        places, the rest as validated lines."""
        keys = self._remember(batch_id, [number for number, _placement in planned], items)
        placements = {key: placement for key, (_number, placement) in zip(keys, planned)}
        with self._ranks_lock:
            self.ranks.continue_after(placements.values())
        self.feed.append(keys, slot_of, placements)
        self.add(batch_id, unplanned, items)

    def _remember(self, batch_id: str, numbers: Sequence[int], items: Mapping[int, WorkItem]) -> list[LineKey]:
        keys = [(batch_id, number) for number in numbers]
        for key in keys:
            item = items.get(key[1])
            if item is not None:
                self.items[key] = item
                self._footprint[0] += line_footprint(len(item.prompt_ids), item.max_new_tokens)
                self._footprint[1] += 1
        return keys

    def line_done(self, key: LineKey, outcome: LineOutcome) -> None:
        """A line got its result: it no longer needs its prompt, unless it is a sample whose length
        refines the plan."""
        item = self.items.pop(key, None)
        if key in self.samples:
            self.samples.discard(key)
            if outcome.ok and item is not None:
                self.observed[key] = (item, outcome.usage.completion_tokens)

    def remove_batch(self, batch_id: str) -> None:
        self.feed.remove_batch(batch_id)
        for mapping in (self.items, self.unplanned):
            for key in [key for key in mapping if key[0] == batch_id]:
                del mapping[key]
        self.samples = {key for key in self.samples if key[0] != batch_id}

    # Planning

    def step(self, validating: bool, starving: bool) -> None:
        """Start a plan in the background when one is due: ``validating`` -- some batch is still
        being validated; ``starving`` -- a slot's window has room and its queue is empty."""
        if self.line_planner is None or self.planning:
            return
        if self._task is not None:
            if not self._task.cancelled() and self._task.exception() is not None:
                logger.error("planning the batches failed; trying again", exc_info=self._task.exception())
            self._task = None
        if self._due(validating, starving):
            self._task = asyncio.create_task(self._plan(provisional=validating))
            self._task.add_done_callback(lambda _task: self.wake())

    def _due(self, validating: bool, starving: bool) -> bool:
        if self.unplanned:
            if not validating or starving:
                return True
            return len(self.unplanned) >= max(FIRST_PROVISIONAL_LINES, self._last_plan_lines)
        # A provisional plan may have taken every line before validation ended (whether a plan is
        # provisional is decided when it is started): the lines left are planned once more.
        last_provisional = bool(self.plans) and self.plans[-1].provisional
        if last_provisional and not validating and any(key not in self.samples for key in self.feed.queued()):
            return True
        return len(self.observed) > self._observed_at_last_plan and not self.samples and len(self.feed) > 0

    async def _plan(self, provisional: bool) -> None:
        queued = [key for key in self.feed.queued() if key not in self.samples]
        keys = [*queued, *self.unplanned]
        items = [(key, self.items[key]) for key in keys if key in self.items]
        observed = dict(self.observed)
        plan, placements = await asyncio.get_running_loop().run_in_executor(
            self._thread, self._plan_lines, items, observed
        )
        still = set(self.feed.queued()) | self.unplanned.keys()
        # A line without a prompt (its prepared prompt was lost) still runs, after the plan.
        order = [key for key in (*plan.feed, *(key for key in keys if key not in self.items)) if key in still]
        slot_of = {key: self.feed.slot_of(key) for key in order if key in self.feed}
        new = [key for key in order if key not in slot_of]
        slot_of.update(self.choose_slots(new, self.items))
        self.feed.replace(order, slot_of, placements)
        for key in order:
            self.unplanned.pop(key, None)
        self._observed_at_last_plan = len(observed)
        self._last_plan_lines = 2 * len(keys)
        self.plans.append(PlanRecord(len(keys), provisional, len(observed), self._next_rank))
        logger.info(
            "planned %d lines%s (%d samples observed, memory share %.2f)",
            len(keys),
            " provisionally" if provisional else "",
            len(observed),
            plan.memory_share,
        )
        first_rank, self._next_rank = self._next_rank, self._next_rank + len(order)
        await asyncio.to_thread(self._store_plan, order, placements, first_rank)

    def _plan_lines(
        self,
        lines: list[tuple[LineKey, WorkItem]],
        observed: Mapping[LineKey, tuple[WorkItem, int]],
    ) -> tuple[BatchPlan[LineKey], dict[LineKey, Placement]]:
        """The plan and its lines' placements (in a worker thread: tens of thousands of them cost
        the event loop too long), each carrying the digest of the prompt ids it was planned on,
        which the scheduler checks against the ids it runs."""
        assert self.line_planner is not None, "only a keeper with a planner plans (step)"
        items = [WorkItem(key, item.prompt_ids, item.max_new_tokens, item.exact_output_len) for key, item in lines]
        plan = self.line_planner.plan(items, observed, 0.0)
        prompts = {item.key: prompt_digest(item.prompt_ids) for item in items}
        with self._ranks_lock:
            return plan, self.ranks.place(plan, prompts)

    def _store_plan(self, order: Sequence[LineKey], placements: Mapping[LineKey, Placement], first_rank: int) -> None:
        """Each line's rank (after every earlier plan's: a restarted runner feeds by rank) and placement."""
        by_batch: dict[str, list[tuple[int, int, Placement]]] = {}
        for rank, key in enumerate(order, start=first_rank):
            by_batch.setdefault(key[0], []).append((key[1], rank, placements[key]))
        for batch_id, places in by_batch.items():
            self.store.set_plan(batch_id, self.owner, places)

    # Samples

    def _is_sample(self, key: LineKey) -> bool:
        item = self.items.get(key)
        planner = self.line_planner
        return item is not None and planner is not None and planner.blend and is_sample(key[0], key[1], item)

    def _sample_placement(self, key: LineKey) -> Placement:
        with self._ranks_lock:
            position = self.ranks.take_compute()
        return sample_placement(position, self.items[key])


def is_sample(job: str, line_number: int, item: WorkItem) -> bool:
    """Whether a line of a plan that blends is one of the output-length samples run first: a share
    (`DEFAULT_SAMPLE_RATE`) of the lines whose length is not fixed, picked by a hash of the job and
    the line's number. The simulator's feed picks them by the same rule."""
    if item.exact_output_len:
        return False
    digest = hashlib.blake2b(f"{job}/{line_number}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < DEFAULT_SAMPLE_RATE


def sample_placement(position: int, item: WorkItem) -> Placement:
    """An output-length sample's placement: ahead of every plan, its output at the fallback bound."""
    return Placement(
        SAMPLE, position, 1.0, min(item.max_new_tokens, DEFAULT_FALLBACK), prompt=prompt_digest(item.prompt_ids)
    )

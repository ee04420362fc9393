"""The prefix-aware assigner on real batch lines and tiny-llama's real tokenizer and chat template:
whole prompt families per slot, balanced counts, and invalid lines placed too."""

from __future__ import annotations

import json
from collections import Counter

from sgl_blend.core.cost_model import BUILTIN_HARDWARE
from sgl_blend.jobs.line_work import LinePartitioner
from sgl_blend.models.registry import resolve_model_path
from sgl_blend.server.assignment import PrefixAssigner, Slot, worker_slots
from sgl_blend.server.store import LineRow
from tests.scale.lines import family_lines, family_of


def rows_of(texts: list[str]) -> tuple[list[LineRow], dict[int, bytes]]:
    raw = {number: text.encode() for number, text in enumerate(texts, start=1)}
    rows = [LineRow(number, None, 0, len(data)) for number, data in raw.items()]
    return rows, raw


def test_families_stay_whole_and_slots_share_the_work() -> None:
    assigner = PrefixAssigner(LinePartitioner(resolve_model_path("tiny-llama"), BUILTIN_HARDWARE["a100-80g"]))
    lines = family_lines(4, 6)
    rows, raw = rows_of([json.dumps(line) for line in lines] + ["{not json", json.dumps({"custom_id": "no-url"})])
    slots = [Slot("http://a", 0), Slot("http://a", 1)]
    assignment = assigner(rows, slots, lambda row: raw[row.line_number])
    assert sorted(number for numbers in assignment.values() for number in numbers) == list(range(1, len(rows) + 1))
    custom_ids = {number: line["custom_id"] for number, line in enumerate(lines, start=1)}
    families_per_slot = {slot: {family_of(custom_ids[n]) for n in numbers if n in custom_ids}
                         for slot, numbers in assignment.items()}
    assert set(families_per_slot) == set(slots)
    for families in families_per_slot.values():  # one short-answer family and one long-answer family each
        assert sorted(int(family[3:]) % 2 for family in families) == [0, 1]
    assert not set.intersection(*families_per_slot.values())
    assert Counter(len(numbers) for numbers in assignment.values()) == Counter({13: 2})


def test_one_slot_needs_no_tokenizer() -> None:
    assigner = PrefixAssigner(LinePartitioner(resolve_model_path("tiny-llama"), BUILTIN_HARDWARE["a100-80g"]))
    rows, raw = rows_of(["{}", "{}"])
    assert assigner(rows, worker_slots("http://a", 1), lambda row: raw[row.line_number]) == {Slot("http://a"): [1, 2]}
    assert assigner.partitioner.tokenizer._tokenizer is None

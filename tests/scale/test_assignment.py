"""The prefix-aware assigner on real batch lines, validated and tokenised with tiny-llama's real
tokenizer and chat template: whole prompt families per slot, balanced counts, and invalid lines
placed too."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from sgl_blend.core.cost_model import BUILTIN_HARDWARE, CostModel, ModelSpec
from sgl_blend.batch_lines.tokenize import LineTokenizer
from sgl_blend.batch_lines.lines import SUPPORTED_URLS
from sgl_blend.models.registry import resolve_model_path
from sgl_blend.server.assignment import PrefixAssigner, Slot, worker_slots
from sgl_blend.server.prepared import PreparedBatch, PreparedWriter
from sgl_blend.server.store import LineRow
from sgl_blend.server.validation import LineLimits, tokenised, validate_input
from tests.scale.lines import family_lines, family_of


def validated(tmp_path: Path, texts: list[str]) -> tuple[list[LineRow], PreparedBatch]:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(text + "\n" for text in texts))
    writer = PreparedWriter(tmp_path / "prepared")
    rows = [row for chunk, _prompts in validate_input(source, LineLimits(SUPPORTED_URLS, 100), writer,
                                                      tokenised(LineTokenizer(resolve_model_path("tiny-llama"))))
            for row in chunk]
    writer.close()
    return rows, PreparedBatch(tmp_path / "prepared")


def assigner() -> PrefixAssigner:
    model = ModelSpec.from_hf_dir(resolve_model_path("tiny-llama"))
    return PrefixAssigner(CostModel(model, BUILTIN_HARDWARE["a100-80g"]))


def test_families_stay_whole_and_slots_share_the_work(tmp_path: Path) -> None:
    lines = family_lines(4, 6)
    rows, prepared = validated(tmp_path, [json.dumps(line) for line in lines]
                               + ["{not json", json.dumps({"custom_id": "no-url"})])
    slots = [Slot("http://a", 0), Slot("http://a", 1)]
    assignment = assigner()([row.line_number for row in rows], slots, prepared.prompts())
    assert sorted(number for numbers in assignment.values() for number in numbers) == list(range(1, len(rows) + 1))
    custom_ids = {number: line["custom_id"] for number, line in enumerate(lines, start=1)}
    families_per_slot = {slot: {family_of(custom_ids[n]) for n in numbers if n in custom_ids}
                         for slot, numbers in assignment.items()}
    assert set(families_per_slot) == set(slots)
    for families in families_per_slot.values():  # one short-answer family and one long-answer family each
        assert sorted(int(family[3:]) % 2 for family in families) == [0, 1]
    assert not set.intersection(*families_per_slot.values())
    assert Counter(len(numbers) for numbers in assignment.values()) == Counter({13: 2})


def test_one_slot_takes_every_line_in_file_order() -> None:
    assert assigner()([2, 1], worker_slots("http://a", 1), {}) == {Slot("http://a"): [1, 2]}

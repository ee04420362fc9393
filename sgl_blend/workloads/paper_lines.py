"""The paper's workloads (Table 2 traces and the density x sharing grid) as OpenAI batch files.

The simulator's workloads (`workloads.mixer`) give each request a chain of shared prompt segments
(a trace's system prompt, an MMLU subject's few-shot template), a unique tail and an output
length. A batch line must carry text, and the engine tokenises that text itself, so each segment
becomes words that are one token each in the tokenizer the emulated engine uses (SmolLM2's, for
Llama-3.1's shapes): a segment of ``L`` tokens is ``L`` such words chosen from its hash, so two
prompts that share a segment share exactly its tokens, and a line's prompt has the length the
workload gave it. Lines are completions with ``ignore_eos`` and ``max_tokens`` set to the
workload's output length, so output lengths follow the workload on an engine whose forward emits
no EOS. Same (workload, n, seed), same file.

The paper mixes 40,000 requests, OpenVid's outputs normalised to a 16K mean. A run of ``n`` lines
scales OpenVid's outputs by ``n / 40,000`` (the mixer then takes more of them to reach the same
compute density): at 4,000 lines a 16K-token output alone would decode for longer than the whole
rest of the batch needs, and every order would finish when that one request does.
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

from sgl_blend.core.cost_model import CostModel
from sgl_blend.sim.workload import SimRequest
from sgl_blend.workloads.mixer import named_workload

# Enough distinct one-token words that random text shares no accidental prefix beyond a word.
VOCABULARY_SIZE = 4096
PAPER_REQUESTS = 40_000
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz")


@functools.lru_cache(maxsize=4)
def one_token_words(model_path: str) -> tuple[str, ...]:
    """Lower-case words that the model's tokenizer reads as one token each, with their leading
    space, checked by encoding each one."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    candidates = sorted(
        token[1:]
        for token in tokenizer.get_vocab()
        if token.startswith("Ġ") and 3 <= len(token) - 1 <= 8 and set(token[1:]) <= _WORD_CHARS
    )
    words = [word for word in candidates if len(tokenizer.encode(" " + word, add_special_tokens=False)) == 1]
    if len(words) < VOCABULARY_SIZE:
        raise ValueError(f"{model_path}'s tokenizer has only {len(words)} one-token words")
    return tuple(words[:VOCABULARY_SIZE])


def _words(seed_text: str, count: int, words: tuple[str, ...]) -> str:
    rng = random.Random(int.from_bytes(hashlib.blake2b(seed_text.encode(), digest_size=8).digest(), "little"))
    return "".join(" " + words[rng.randrange(len(words))] for _ in range(count))


def request_line(request: SimRequest, words: tuple[str, ...]) -> dict:
    prompt = "".join(_words(key, length, words) for key, length in request.prefix)
    prompt += _words(request.rid, request.unique_len, words)
    return {
        "custom_id": request.rid,
        "method": "POST",
        "url": "/v1/completions",
        "body": {
            "model": "default",
            "prompt": prompt,
            "max_tokens": request.output_len,
            "ignore_eos": True,
            "temperature": 0,
        },
    }


def paper_lines(workload: str, n: int, cost: CostModel, model_path: str | Path, seed: int = 0) -> Iterator[dict]:
    """``workload``: ``trace1``..``trace4`` or ``DENSITY:SHARING`` (`mixer.named_workload`), mixed
    for ``cost``'s model and device; text in ``model_path``'s tokenizer."""
    words = one_token_words(str(model_path))
    for request in paper_requests(workload, n, cost, seed):
        yield request_line(request, words)


def paper_requests(workload: str, n: int, cost: CostModel, seed: int = 0) -> list[SimRequest]:
    """The workload's requests at ``n`` lines, OpenVid's outputs scaled to the run's size."""
    return named_workload(workload, n, cost, seed, long_output_scale=min(1.0, n / PAPER_REQUESTS))

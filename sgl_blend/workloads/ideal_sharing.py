"""The most prompt tokens a batch file's lines can take from the prefix cache: each shared prefix
computed exactly once.

A run's cached tokens mean little without the most it could have cached. A cache that never
evicts computes every distinct prefix of every prompt once, so the ideal is the total prompt
tokens less the tokens of the union trie of all prompts (`PrefixTree`'s ``saved`` at its root).
Prompts are the ids the engine runs: the served model's tokenizer and chat template, as the
planner and `sgl-blend estimate` read a line (`LineTokenizer`, `batch_file.served_tokenizer`).
The tree keeps only what prompts do not share, so a 50K-line document-QA file fits in memory;
lines are tokenised a chunk at a time for the same reason.

Run ``python -m sgl_blend.workloads.ideal_sharing FILE [--model llama-3.1-8b]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from sgl_blend.batch_lines.lines import BatchLine, read_lines
from sgl_blend.batch_lines.tokenize import LineTokenizer
from sgl_blend.core.prefix_tree import PrefixTree
from sgl_blend.sim.batch_file import served_tokenizer

CHUNK_LINES = 512


@dataclass(frozen=True)
class IdealSharing:
    """``cached_tokens``: prompt tokens a cache that never evicts reuses, of ``prompt_tokens``."""

    lines: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def share(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def ideal_sharing_of(prompts: Iterable[list[int]]) -> IdealSharing:
    """The ideal over prompts given as token ids."""
    tree = PrefixTree()
    for index, ids in enumerate(prompts):
        tree.insert(index, ids, 0.0, 0.0)
    return IdealSharing(len(tree), tree.root.prompt_tokens, tree.root.saved)


def _prompts(path: Path, model: str) -> Iterator[list[int]]:
    tokenizer = LineTokenizer(served_tokenizer(model))
    runnable = (line for line in read_lines(path) if isinstance(line, BatchLine))
    while chunk := list(itertools.islice(runnable, CHUNK_LINES)):
        yield from tokenizer.prompt_ids_batch(chunk)


def ideal_sharing(path: Path, model: str = "llama-3.1-8b") -> IdealSharing:
    """The ideal over the runnable lines of the batch file at ``path``, tokenised for ``model``
    (an emulated model reads prompts with the stand-in's tokenizer, as its engine does)."""
    return ideal_sharing_of(_prompts(path, model))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sgl_blend.workloads.ideal_sharing", description=__doc__.splitlines()[0]
    )
    parser.add_argument("file", type=Path, help="an OpenAI batch file")
    parser.add_argument("--model", default="llama-3.1-8b", help="the served model whose tokenizer reads the prompts")
    args = parser.parse_args(argv)
    count = ideal_sharing(args.file, args.model)
    print(json.dumps({"file": str(args.file), **asdict(count), "share": round(count.share, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

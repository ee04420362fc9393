"""Simulated requests and their JSONL form.

A prompt is a shared prefix (a few-shot template or a system prompt, identified by its key and
length) plus a unique tail. That is all the simulator's prefix cache needs, and it keeps 400K
requests small: the token ids given to the policy's prefix tree are generated from the key and
the request's seed, so a workload file stores lengths and keys, never token arrays.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

VOCAB = 128000


@dataclass(frozen=True)
class SimRequest:
    rid: str
    prefix_key: str | None
    prefix_len: int
    unique_len: int
    output_len: int
    max_new_tokens: int
    exact: bool = True
    source: str = ""

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + self.unique_len

    @property
    def prompt_ids(self) -> array:
        return _prefix_tokens(self.prefix_key, self.prefix_len) + _tail_tokens(self.rid, self.unique_len)


def _random_tokens(seed_text: str, length: int) -> array:
    seed = int.from_bytes(hashlib.blake2b(seed_text.encode(), digest_size=8).digest(), "little")
    tokens = array("i")
    tokens.frombytes(np.random.default_rng(seed).integers(0, VOCAB, size=length, dtype=np.int32).tobytes())
    return tokens


@lru_cache(maxsize=4096)
def _prefix_tokens(key: str | None, length: int) -> array:
    if key is None or length == 0:
        return array("i")
    return _random_tokens(f"prefix:{key}", length)


def _tail_tokens(rid: str, length: int) -> array:
    return _random_tokens(f"tail:{rid}", length)


def save_jsonl(requests: Iterable[SimRequest], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for request in requests:
            handle.write(json.dumps(asdict(request)) + "\n")
    return path


def load_jsonl(path: Path) -> Iterator[SimRequest]:
    with path.open() as handle:
        for line in handle:
            if line.strip():
                yield SimRequest(**json.loads(line))

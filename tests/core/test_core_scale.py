"""The core-scale benchmark's engine loop: it must drive the policy through admissions and
finishes, so the latency it reports is of decisions that admitted something."""

from __future__ import annotations

import random

from bench.core_scale import drive
from sgl_blend.core.cost_model import HardwareSpec, model_spec
from sgl_blend.core.policies import make_policy
from sgl_blend.core.protocol import OfflineRequest


def workload(n: int = 400, seed: int = 0) -> list[OfflineRequest]:
    rng = random.Random(seed)
    templates = [[rng.randrange(1, 50000) for _ in range(200)] for _ in range(8)]
    requests = []
    for i in range(n):
        if i % 2:
            prompt = templates[i % 8] + [rng.randrange(1, 50000) for _ in range(20)]
            requests.append(OfflineRequest(f"f{i}", prompt, 4, exact_output_len=True))
        else:
            requests.append(OfflineRequest(f"s{i}", [rng.randrange(1, 50000) for _ in range(rng.randrange(50, 300))],
                                           rng.randrange(16, 400)))
    return requests


def test_the_driven_loop_admits_finishes_and_separates_admitting_decisions() -> None:
    requests = workload()
    outputs = {r.rid: (len(r.prompt_ids), r.max_new_tokens) for r in requests}
    for paced in (False, True):
        policy = make_policy("blendserve", model_spec("llama-3.1-8b"), HardwareSpec.resolve("a100-80g"),
                             paced=paced, sample_rate=0.0)
        policy.submit(requests)
        admitting, idle, counts = drive(policy, outputs, 200_000, 3000, seed=0)
        assert counts["admitted"] == len(requests)
        assert counts["finished"] == len(requests)
        assert len(admitting) >= 1 and len(admitting) + len(idle) == 3000
        assert len(admitting) <= counts["admitted"]

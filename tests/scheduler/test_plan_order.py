"""A 5,000-line shuffled batch planned globally reaches SGLang's scheduler in plan order, from both
ends, and the scheduler's run replays through the same policy to the same decisions.

The job runs on the emulated H100 with Llama-3.1-8B's shapes (`--emulate h100`): SGLang's real
scheduler, each forward priced, no model computed, so 5,000 lines run in a couple of minutes on
this CPU. Its measured overlap makes blending pay, so BlendServe plans a compute side and a memory
side and paces prefill; the KV pool is cut to 8,192 tokens so admission is what the plan decides.
The plugin records every call SGLang's scheduler makes on the policy (the ``record_policy_calls``
setting) and every admission with its plan position.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sgl_blend.workloads.batch_files import write_jsonl
from sgl_blend.core.cost_model import model_spec
from sgl_blend.core.policy_log import replay
from sgl_blend.core.psm_policy import make_offline_policy
from sgl_blend.jobs.fresh_server import run_on_fresh_server
from sgl_blend.jobs.run_batch import JobOptions, JobTotals
from sgl_blend.sglang_plugin.settings import configured_hardware
from tests.conftest import free_port

pytestmark = pytest.mark.server

LINES = 5000
MODEL, DEVICE, HARDWARE = "llama-3.1-8b", "h100", "h100-sxm"
CHUNK = 8192  # SGLang's chunked-prefill size on an 80 GB GPU, which the emulated server gets


def shuffled_batch(n: int = LINES, families: int = 40, seed: int = 0) -> list[dict]:
    """Families share a prompt prefix; half answer in 1-2 tokens, half in 12-16, so the plan has
    compute-heavy and memory-heavy requests; shuffled, so file order shares nothing."""
    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi".split()
    prefixes = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(families)]
    lines = []
    for index in range(n):
        family = index % families
        prompt = f"{prefixes[family]} question {index} {rng.choice(words)}"
        max_tokens = rng.choice((1, 2)) if family % 2 else rng.choice((12, 16))
        lines.append({"custom_id": f"f{family}-{index}", "method": "POST", "url": "/v1/completions",
                      "body": {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                               "ignore_eos": True}})
    rng.shuffle(lines)
    return lines


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobTotals, dict[str, Any]]:
    root = tmp_path_factory.mktemp("plan-order")
    batch_file = write_jsonl(root / "batch.jsonl", shuffled_batch())
    return run_on_fresh_server(MODEL, "blendserve", batch_file, root / "out.jsonl", root / "errors.jsonl",
                               sglang_args=["--port", str(free_port()), "--max-total-tokens", "8192"],
                               emulate=DEVICE, server_log=root / "server.log",
                               options=JobOptions(max_inflight=256, show_progress=False),
                               settings_overrides={"record_policy_calls": True})


def test_every_line_answered_once(run: tuple[JobTotals, dict[str, Any]]) -> None:
    totals, state = run
    assert totals.completed == LINES and totals.failed == 0 and totals.not_run == 0
    assert state["offline"]["counts"]["finished"] == LINES


def ranks_of(positions: list[int]) -> list[int]:
    """Each admission's rank among ``positions`` sorted ascending."""
    by_position = sorted(range(len(positions)), key=positions.__getitem__)
    ranks = [0] * len(positions)
    for rank, index in enumerate(by_position):
        ranks[index] = rank
    return ranks


def test_lines_are_admitted_in_plan_order_from_both_ends(run: tuple[JobTotals, dict[str, Any]]) -> None:
    admissions = run[1]["offline"]["admissions"]
    assert len(admissions) == LINES
    by_side: dict[str, list[int]] = {}
    for _iteration, _rid, side, position, _tokens, _cap in admissions:
        assert position is not None, "every line arrives with its placement"
        by_side.setdefault(side, []).append(position)
    assert set(by_side) == {"compute", "memory"}, set(by_side)
    compute, memory = by_side["compute"], by_side["memory"]
    # The runner plans what it has validated so far, then everything unsent, so lines of two plans
    # meet in the engine; a line that arrives waits for the in-engine re-plan (5% new lines), and a
    # line whose shared prefix another line is computing waits until that forward's result is in.
    # So the order is the plan's up to local jitter: each line is admitted near its rank on its side.
    for side, positions in (("compute", compute), ("memory", [-position for position in memory])):
        displacement = sorted(abs(rank - index) for index, rank in enumerate(ranks_of(positions)))
        assert displacement[len(displacement) // 2] <= 0.02 * LINES, (side, displacement[len(displacement) // 2])
        assert displacement[int(0.95 * len(displacement))] <= 0.1 * LINES, (side, displacement[int(0.95 * len(displacement))])
    assert max(compute) < min(memory), "the compute side is the plan's left, the memory side its right"
    iterations_with_both = {a[0] for a in admissions if a[2] == "compute"} & {a[0] for a in admissions if a[2] == "memory"}
    assert len(iterations_with_both) > 0.05 * len({a[0] for a in admissions}), "both ends fed together"


def test_prefill_is_capped_by_the_policys_budget(run: tuple[JobTotals, dict[str, Any]]) -> None:
    caps = [admission[5] for admission in run[1]["offline"]["admissions"]]
    assert all(cap is not None for cap in caps) and min(caps) < CHUNK // 4, sorted(set(caps))[:10]


def test_the_scheduler_run_replays_to_the_same_decisions(run: tuple[JobTotals, dict[str, Any]]) -> None:
    calls = run[1]["offline"]["policy_calls"]
    assert calls[0][0] == "capacity" and any(call[0] == "budget" for call in calls)
    # the server runs SGLang's overlap scheduler (its default): a forward's prefix is cached two
    # processed results after its admission
    fresh = make_offline_policy("blendserve", model_spec(MODEL), configured_hardware(1, HARDWARE), batches_in_flight=2)
    mismatches = replay(calls, fresh)
    assert mismatches == [], json.dumps(mismatches[:5])

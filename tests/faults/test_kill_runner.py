"""kill -9 of a runner at random moments and at named points of its work -- after a chunk of
validated lines is stored (mid-validation), after one batch's plan ranks are stored and before the
other's (mid-planning), after result bytes are fsynced, inside the commit before it is sent, just
after it -- at least 30 times on each store backend, restarting a runner on the same store after
each kill. Every batch then completes with every custom_id exactly once, its files matching the
store to the byte.

Each kill is a real SIGKILL of a real runner process; the engine is the shared tiny-llama server.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from sgl_blend.launch.supervisor import ServerProcess
from sgl_blend.server.store import TERMINAL_STATUSES
from tests.batch.conftest import API_KEY
from tests.faults.helpers import (KILLED, RUNNER_LIMIT_S, all_violations, fresh_store, new_batch, opened,
                                  run_to_the_end)
from tests.faults.runner_process import RunnerConfig, start_runner

pytestmark = [pytest.mark.faults, pytest.mark.server]
KILLS = 30
# A point the runner kills itself at; None: the test kills it after a random delay.
POINTS = ("lines_added", "plan_stored", "results_synced", "before_commit", "after_commit", None)
# Points a fresh batch is sure to reach (its validation and the plan it joins), and the random
# moment, which needs work left when it comes.
NEEDS_NEW_BATCH = ("lines_added", "plan_stored", None)
MAX_CYCLES = 4 * KILLS
# The random kill comes within this many seconds of the start; halved each time the runner finished
# its batches before it (a fast machine), so that random kills land too.
RANDOM_HORIZON_S = 3.0


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_kill_9_at_random_moments_loses_and_doubles_nothing(backend: str, batch_server: ServerProcess,
                                                            postgres_url: str, tmp_path: Path) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    store_url, data_dir = fresh_store(backend, postgres_url), tmp_path / "data"
    config = RunnerConfig(store_url, data_dir, batch_server.base_url, API_KEY, owner="fault-runner",
                          log_path=tmp_path / "runner.log")
    batches: dict[str, list[str]] = {}
    kills: Counter[str] = Counter()
    horizon_s = RANDOM_HORIZON_S
    for cycle in range(MAX_CYCLES):
        if sum(kills.values()) >= KILLS and len(kills) == len(POINTS):
            break
        point = POINTS[cycle % len(POINTS)]
        with opened(store_url, data_dir) as store:
            running = [batch_id for batch_id in batches if store.get_batch(batch_id).status not in TERMINAL_STATUSES]
        for _ in range(max(2 - len(running), int(point in NEEDS_NEW_BATCH))):
            batch_id, custom_ids = new_batch(store_url, data_dir)
            batches[batch_id] = custom_ids
        spec = f"{point}:{rng.randint(1, 2)}" if point else ""
        process = start_runner(RunnerConfig(**{**config.__dict__, "kill_at": spec}))
        if point is None:
            process.join(rng.uniform(0.05, 1.0) * horizon_s)
            process.kill()
        process.join(RUNNER_LIMIT_S)
        assert process.exitcode in (0, KILLED), f"seed {seed}: the runner ended with {process.exitcode}"
        if process.exitcode == KILLED:
            kills[point or "random"] += 1
        elif point is None:
            horizon_s /= 2
    run_to_the_end(config)
    print(f"{backend}: seed {seed}, kills by point {dict(kills)}, {len(batches)} batches")

    assert sum(kills.values()) >= KILLS, f"seed {seed}: only {kills} kills in {MAX_CYCLES} runs"
    assert set(kills) == {point or "random" for point in POINTS}, f"seed {seed}: kills by point {kills}"
    assert all_violations(store_url, data_dir, batches) == [], f"seed {seed}, kills {kills}"

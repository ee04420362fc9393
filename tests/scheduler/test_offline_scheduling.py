"""BlendServe inside the real SGLang scheduler, on tiny-llama, against SGLang's own FCFS and exact DFS.

One job of 300 few-shot lines (16 shared prefixes of ~700 tokens, output lengths 1-128 by group),
shuffled, runs once per policy on a server whose KV pool (8192 tokens) cannot hold every prefix
at once, so the order decides how often SGLang's radix cache hits. On this CPU the measured
overlap gives blending nothing, so BlendServe must order by prefix and match DFS's sharing
(blending from both ends is tested on a modelled GPU in `test_plan_order`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
import requests

from sgl_blend.workloads.batch_files import fewshot_lines, iter_jsonl, write_jsonl
from sgl_blend.jobs.fresh_server import run_on_fresh_server
from sgl_blend.jobs.run_batch import JobOptions, JobTotals
from sgl_blend.launch.supervisor import ServerProcess
from tests.conftest import free_port
from tests.waiting import wait_for

# The module's fixture runs the job on three fresh servers, and its time counts against the first
# test: on this 2-core host 108 s alone and 862 s beside two busy processes; past the suite's
# 900 s on a CI host whose other test worker was busy beside it.
pytestmark = [pytest.mark.server, pytest.mark.timeout(2400)]

KV_TOKENS = "8192"
GROUPS = 16
ONLINE_REQUESTS = 6


@dataclass
class OnlineAnswer:
    """An online answer, and how many offline results the job had written when it was sent and
    when it came back."""

    text: str
    results_when_sent: int
    results_when_answered: int


@dataclass
class PolicyRun:
    texts: dict[str, str]
    totals: JobTotals
    plugin: dict[str, Any]
    online: list[OnlineAnswer] = field(default_factory=list)


def results_written(output: Path) -> int:
    """Whole result lines the job has written so far."""
    return output.read_bytes().count(b"\n") if output.exists() else 0


def online_chat(run: PolicyRun, output: Path) -> Callable[[ServerProcess], None]:
    """Online requests on SGLang's ordinary chat route, sent one after another once the job has
    finished its first offline line, so that they compete with the job; each answer's time."""

    def send(server: ServerProcess) -> None:
        wait_for(lambda: results_written(output), "the job's first offline result")
        for index in range(ONLINE_REQUESTS):
            sent = results_written(output)
            response = requests.post(f"{server.base_url}/v1/chat/completions", timeout=300, json={
                "model": "default", "messages": [{"role": "user", "content": f"online question {index}"}],
                "max_tokens": 8, "temperature": 0})
            response.raise_for_status()
            run.online.append(OnlineAnswer(response.json()["choices"][0]["message"]["content"], sent,
                                           results_written(output)))

    return send


def run_policy(policy: str, batch_file: Path, work: Path) -> PolicyRun:
    run = PolicyRun({}, JobTotals(), {})
    output = work / "out.jsonl"
    run.totals, run.plugin = run_on_fresh_server(
        "tiny-llama", policy, batch_file, output, work / "errors.jsonl",
        sglang_args=["--port", str(free_port()), "--max-total-tokens", KV_TOKENS], server_log=work / "server.log",
        options=JobOptions(show_progress=False), while_running=online_chat(run, output) if policy == "blendserve" else None)
    for record in iter_jsonl(output):
        assert record["custom_id"] not in run.texts, f"{record['custom_id']} answered twice"
        run.texts[record["custom_id"]] = record["response"]["body"]["choices"][0]["text"]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PolicyRun]:
    root = tmp_path_factory.mktemp("offline-scheduling")
    batch_file = write_jsonl(root / "fewshot.jsonl", fewshot_lines(n=300, groups=GROUPS, seed=0))
    results = {}
    for policy in ("fcfs", "dfs", "blendserve"):
        (root / policy).mkdir()
        results[policy] = run_policy(policy, batch_file, root / policy)
    return results


def test_every_request_answered_once_with_fcfs_text(runs: dict[str, PolicyRun]) -> None:
    expected = {line["custom_id"] for line in fewshot_lines(n=300, groups=GROUPS, seed=0)}
    for policy, run in runs.items():
        assert set(run.texts) == expected, policy
        assert run.totals.failed == 0, policy
        assert run.plugin["offline"]["policy"] == policy
    # A request's KV is computed in batches of other shapes under another order (and its prefix
    # may come from the radix cache), so float rounding differs, and a random-weight model's rare
    # near-tie can flip one greedy token; an answer sent to the wrong request would differ in
    # nearly all of them.
    mismatched = [cid for cid, text in runs["blendserve"].texts.items() if text != runs["fcfs"].texts[cid]]
    assert len(mismatched) <= len(expected) // 100, f"{len(mismatched)} texts differ from the fcfs run: {mismatched[:3]}"


def test_cache_hits_blendserve_close_to_dfs_and_above_fcfs(runs: dict[str, PolicyRun]) -> None:
    cached = {policy: run.totals.cached_tokens for policy, run in runs.items()}
    # BlendServe's run also serves online requests, which take KV the 8,192-token pool would
    # spend on prefixes, and runs its output-length samples first; how far the first provisional
    # plan reaches before the final one depends on how fast this host validates (0.94 of DFS was
    # seen on a loaded CI host, at least 0.97 on an idle one). FCFS on this shuffled file keeps about 0.64.
    assert cached["blendserve"] >= 0.9 * cached["dfs"], cached
    assert cached["blendserve"] > 1.2 * cached["fcfs"], cached


def test_blendserve_on_this_cpu_scans_one_side_unpaced(runs: dict[str, PolicyRun]) -> None:
    offline = runs["blendserve"].plugin["offline"]
    assert offline["policy"] == "blendserve" and offline["counts"]["finished"] == 300
    sides = {admission[2] for admission in offline["admissions"]}
    assert sides == {"compute"}, sides
    assert not offline["counts"].get("blended_iterations")


def test_online_requests_complete_during_the_job(runs: dict[str, PolicyRun]) -> None:
    """Each online request, sent after the job's first offline result, is answered before its last
    one: online traffic is served while the job runs, not queued behind it."""
    run = runs["blendserve"]
    assert len(run.online) == ONLINE_REQUESTS and all(answer.text for answer in run.online)
    total = len(run.texts)
    for answer in run.online:
        assert 0 < answer.results_when_sent <= answer.results_when_answered < total, (answer, total)

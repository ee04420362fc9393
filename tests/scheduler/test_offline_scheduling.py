"""BlendServe inside the real SGLang scheduler, on tiny-llama, against SGLang's own FCFS and exact DFS.

One job of 300 few-shot lines (16 shared prefixes of ~700 tokens, output lengths 1-128 by group),
shuffled, runs once per policy on a server whose KV pool (8192 tokens) cannot hold every prefix
at once, so the order decides how often SGLang's radix cache hits. On this CPU the measured
overlap gives blending nothing, so BlendServe must order by prefix and match DFS's sharing
(blending from both ends is tested on a modelled GPU in `test_plan_order`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import requests

from sgl_blend.workloads.batch_files import fewshot_lines, iter_jsonl, write_jsonl
from sgl_blend.jobs.fresh_server import run_on_fresh_server
from sgl_blend.jobs.run_batch import JobTotals
from sgl_blend.launch.supervisor import ServerProcess
from tests.conftest import free_port

KV_TOKENS = "8192"
GROUPS = 16
ONLINE_REQUESTS = 6


@dataclass
class PolicyRun:
    texts: dict[str, str]
    totals: JobTotals
    plugin: dict[str, Any]
    online_answers: list[str]


def online_chat(answers: list[str]) -> Callable[[ServerProcess], None]:
    """Online requests sent while the BlendServe job runs, on SGLang's ordinary chat route (only
    then: under SGLang's own FCFS they would wait behind the whole job)."""

    def send(server: ServerProcess) -> None:
        for index in range(ONLINE_REQUESTS):
            response = requests.post(f"{server.base_url}/v1/chat/completions", timeout=300, json={
                "model": "default", "messages": [{"role": "user", "content": f"online question {index}"}],
                "max_tokens": 8, "temperature": 0})
            response.raise_for_status()
            answers.append(response.json()["choices"][0]["message"]["content"])

    return send


def run_policy(policy: str, batch_file: Path, work: Path) -> PolicyRun:
    answers: list[str] = []
    totals, plugin = run_on_fresh_server(
        "tiny-llama", policy, batch_file, work / "out.jsonl", work / "errors.jsonl",
        sglang_args=["--port", str(free_port()), "--max-total-tokens", KV_TOKENS], server_log=work / "server.log",
        show_progress=False, while_running=online_chat(answers) if policy == "blendserve" else None)
    texts = {}
    for record in iter_jsonl(work / "out.jsonl"):
        assert record["custom_id"] not in texts, f"{record['custom_id']} answered twice"
        texts[record["custom_id"]] = record["response"]["body"]["choices"][0]["text"]
    return PolicyRun(texts, totals, plugin, answers)


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
    mismatched = [cid for cid, text in runs["blendserve"].texts.items() if text != runs["fcfs"].texts[cid]]
    assert not mismatched, f"{len(mismatched)} texts differ from the fcfs run, e.g. {mismatched[:3]}"


def test_cache_hits_blendserve_close_to_dfs_and_above_fcfs(runs: dict[str, PolicyRun]) -> None:
    cached = {policy: run.totals.cached_tokens for policy, run in runs.items()}
    assert cached["blendserve"] >= 0.97 * cached["dfs"], cached
    assert cached["blendserve"] > cached["fcfs"], cached


def test_blendserve_on_this_cpu_scans_one_side_unpaced(runs: dict[str, PolicyRun]) -> None:
    offline = runs["blendserve"].plugin["offline"]
    assert offline["policy"] == "blendserve" and offline["counts"]["finished"] == 300
    sides = {admission[2] for admission in offline["admissions"]}
    assert sides == {"compute"}, sides
    assert not offline["counts"].get("blended_iterations")


def test_online_requests_complete_during_the_job(runs: dict[str, PolicyRun]) -> None:
    answers = runs["blendserve"].online_answers
    assert len(answers) >= 2 and all(answers)
    assert runs["fcfs"].plugin["offline"]["policy"] == "fcfs"

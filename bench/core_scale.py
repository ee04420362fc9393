"""Scale benchmark of the BlendServe core: 400,000 tokenised requests through the same policy
object the SGLang plugin uses -- build the tree, sort and split, produce the scan order -- then
time single admission decisions. Tokenisation is done first and reported apart: the engine
tokenises anyway, as the paper notes.

    python -m bench.core_scale --n 400000

Writes ``bench/results/core_scale.json`` and a plot of the phases and the decision latencies.
After planning, the long-lived tree is moved out of the garbage collector's way (``gc.freeze``),
as SGLang's server does after its warm-up, so a decision is not charged for a full-heap scan.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import resource
import statistics
import time
from array import array
from pathlib import Path

from bench.batch_files import iter_sharegpt_conversations
from sgl_blend.core.cost_model import HardwareSpec, model_spec
from sgl_blend.core.policies import make_policy
from sgl_blend.core.protocol import OfflineRequest

RESULTS = Path(__file__).parent / "results"
SHARE = {"sharegpt": 0.5, "fewshot": 0.4, "long_output": 0.1}


def tokenizer():
    from transformers import AutoTokenizer

    from sgl_blend.models.registry import prepare

    return AutoTokenizer.from_pretrained(str(prepare("smollm2-135m")[0]))


def build_requests(n: int, seed: int) -> tuple[list[OfflineRequest], float]:
    """The mixed workload and the seconds spent tokenising it."""
    rng = random.Random(seed)
    start = time.perf_counter()
    texts = []
    for conversation in iter_sharegpt_conversations(limit=40000):
        turns = conversation.get("conversations") or []
        if turns and turns[0].get("from") == "human" and turns[0].get("value"):
            texts.append(turns[0]["value"][:4000])
    encoded = [array("i", ids) for ids in tokenizer()(texts, add_special_tokens=False)["input_ids"] if ids]
    tokenise_seconds = time.perf_counter() - start
    vocab = 49152
    templates = [array("i", (rng.randrange(vocab) for _ in range(rng.randrange(300, 900)))) for _ in range(400)]
    requests: list[OfflineRequest] = []
    counts = {kind: int(n * share) for kind, share in SHARE.items()}
    counts["sharegpt"] += n - sum(counts.values())
    for index in range(counts["sharegpt"]):
        prompt = encoded[rng.randrange(len(encoded))] + array("i", (index % vocab, index // vocab))
        requests.append(OfflineRequest(f"s{index}", prompt, rng.randrange(16, 1024)))
    for index in range(counts["fewshot"]):
        question = array("i", (rng.randrange(vocab) for _ in range(rng.randrange(20, 60))))
        requests.append(OfflineRequest(f"f{index}", templates[index % len(templates)] + question,
                                       rng.randrange(1, 6), exact_output_len=True))
    for index in range(counts["long_output"]):
        prompt = array("i", (rng.randrange(vocab) for _ in range(rng.randrange(100, 500))))
        requests.append(OfflineRequest(f"v{index}", prompt, int(rng.expovariate(1 / 16384)) + 256, exact_output_len=True))
    rng.shuffle(requests)
    return requests, tokenise_seconds


def run(n: int, seed: int, decisions: int) -> dict:
    requests, tokenise_seconds = build_requests(n, seed)
    prompt_tokens = sum(len(request.prompt_ids) for request in requests)
    policy = make_policy("blendserve", model_spec("llama-3.1-8b"), HardwareSpec.resolve("a100-80g"), seed=seed)
    capacity = policy.cost_model.kv_capacity_tokens()

    start = time.perf_counter()
    policy.submit(requests)
    build_seconds = time.perf_counter() - start
    del requests
    start = time.perf_counter()
    policy.propose(0, 0)
    plan_seconds = time.perf_counter() - start
    gc.freeze()

    latencies = []
    running: list[str] = []
    for _ in range(decisions):
        start = time.perf_counter()
        proposal = policy.propose(capacity, 1)
        policy.admitted([request.rid for request in proposal])
        latencies.append(time.perf_counter() - start)
        running.extend(request.rid for request in proposal)
        if len(running) > 256:
            finished = running.pop(0)
            policy.finished(finished, 1)
    latencies.sort()
    plan = policy.last_plan
    return {
        "requests": n,
        "prompt_tokens": prompt_tokens,
        "tokenise_seconds_not_counted": round(tokenise_seconds, 2),
        "build_seconds": round(build_seconds, 2),
        "sort_split_scan_order_seconds": round(plan_seconds, 2),
        "total_seconds": round(build_seconds + plan_seconds, 2),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "tree_sharing_ratio": round(policy.tree.sharing_ratio(), 4),
        "plan_sharing_kept": round(plan.sharing_kept, 4),
        "splits": plan.splits,
        "scan_boundary": plan.boundary,
        "decisions": decisions,
        "decision_p50_ms": round(statistics.median(latencies) * 1e3, 4),
        "decision_p99_ms": round(latencies[int(0.99 * len(latencies))] * 1e3, 4),
        "targets": {"total_seconds": 60, "peak_rss_gib": 4, "decision_p99_ms": 0.1},
    }, latencies


def plot(report: dict, latencies: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (phases, histogram) = plt.subplots(1, 2, figsize=(10, 3.5))
    names = ["build", "sort+split+order"]
    phases.bar(names, [report["build_seconds"], report["sort_split_scan_order_seconds"]], color=["tab:blue", "tab:orange"])
    phases.axhline(60, color="red", linestyle="--", label="60 s target (total)")
    phases.set_ylabel("seconds")
    phases.legend()
    histogram.hist([latency * 1e3 for latency in latencies], bins=60, color="tab:green")
    histogram.axvline(0.1, color="red", linestyle="--", label="0.1 ms P99 target")
    histogram.set_xlabel("admission decision (ms)")
    histogram.legend()
    fig.suptitle(f"BlendServe core on {report['requests']:,} requests")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decisions", type=int, default=20_000)
    parser.add_argument("--json", type=Path, default=RESULTS / "core_scale.json")
    parser.add_argument("--plot", type=Path, default=RESULTS / "core_scale.png")
    args = parser.parse_args()
    report, latencies = run(args.n, args.seed, args.decisions)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, latencies, args.plot)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

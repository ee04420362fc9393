"""Global planning at the paper's scale: `plan_batch` over 400K requests (tree, output-length
samples, sort/split/merge, placements and the two-ended feed order), the step `run-batch` and the
Batch API runner take before feeding the engine. Tokenising is not counted (the engine tokenises
anyway); the requests are `bench.core_scale`'s ShareGPT + few-shot + long-output mix.

    python -m bench.plan_scale --n 400000
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

from bench.core_scale import build_requests
from sgl_blend.core.batch_plan import plan_batch
from sgl_blend.core.cost_model import CostModel, HardwareSpec, model_spec
from sgl_blend.core.dp_shares import WorkItem

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400_000)
    parser.add_argument("--hardware", default="a100-80g")
    parser.add_argument("--out", type=Path, default=RESULTS / "plan_scale.json")
    args = parser.parse_args()
    requests, tokenize_s = build_requests(args.n, seed=0)
    items = [WorkItem(index, request.prompt_ids, request.max_new_tokens, request.exact_output_len)
             for index, request in enumerate(requests)]
    del requests
    cost = CostModel(model_spec("llama-3.1-8b"), HardwareSpec.resolve(args.hardware))
    start = time.perf_counter()
    plan = plan_batch(items, cost, blend=True)
    first = time.perf_counter() - start
    sampled = set(plan.samples)
    observed = {key: (items[key], items[key].max_new_tokens // 2 or 1) for key in plan.samples}
    start = time.perf_counter()
    replanned = plan_batch([item for item in items if item.key not in sampled], cost, blend=True, observed=observed)
    second = time.perf_counter() - start
    report = {"command": f"python -m bench.plan_scale --n {args.n}", "requests": args.n,
              "prompt_tokens": sum(len(item.prompt_ids) for item in items),
              "tokenize_s_not_counted": round(tokenize_s, 1), "plan_s": round(first, 1),
              "replan_after_samples_s": round(second, 1), "samples": len(plan.samples),
              "memory_share": round(replanned.memory_share, 3),
              "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()

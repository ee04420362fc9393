"""An SGLang frontend-language program, run online and then as offline work on an sgl-blend server.

Start a server first (`sgl-blend serve --model smollm2-135m`, or tiny-llama), then:

    python examples/frontend_offline.py --url http://127.0.0.1:30000 [--api-key KEY] [--n 16]

The same `sgl.function` runs twice. First online, on SGLang's own `RuntimeEndpoint`. Then over
many inputs with `run_batch` on `sgl_blend.frontend.OfflineRuntimeEndpoint`: every generate call
it makes carries the offline routing key, so the server's scheduler orders those calls with the
rest of its offline work (BlendServe) while online requests keep going first. Every call starts
with the same few-shot prefix, which the radix cache then holds once for all of them.

It prints one JSON object: the online answer, the offline answers, and how many offline requests
the server's scheduler received meanwhile.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import sglang as sgl
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

from sgl_blend.frontend import OfflineRuntimeEndpoint

FEW_SHOT = (
    "Classify the sentiment of each review as positive or negative.\n"
    "Review: The battery lasts all day and the screen is sharp.\nSentiment: positive\n"
    "Review: It broke after a week and support never answered.\nSentiment: negative\n"
    "Review: Setup took two minutes and it just works.\nSentiment: positive\n"
)
PRODUCTS = ("kettle", "laptop", "bicycle", "headphones", "tent", "camera", "desk lamp", "blender")
OPINIONS = ("works better than I hoped", "arrived scratched and loud", "is worth every penny",
            "stopped charging on day three")


@sgl.function
def classify(s: Any, review: str) -> None:
    s += FEW_SHOT + "Review: " + review + "\nSentiment:"
    s += sgl.gen("sentiment", max_tokens=4, temperature=0)


def reviews(n: int) -> list[str]:
    return [f"The {PRODUCTS[i % len(PRODUCTS)]} {OPINIONS[i % len(OPINIONS)]}." for i in range(n)]


def offline_requests_seen(backend: RuntimeEndpoint) -> int | None:
    """Offline requests the server's scheduler has received so far, as the sgl-blend plugin counts
    them (its pool appears with the first offline request); None without the plugin."""
    plugin = (backend.get_server_info().get("internal_states") or [{}])[0].get("sgl_blend")
    if plugin is None:
        return None
    return ((plugin.get("offline") or {}).get("counts") or {}).get("submitted", 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:30000")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--n", type=int, default=16, help="inputs for the offline run")
    args = parser.parse_args()

    online = RuntimeEndpoint(args.url, api_key=args.api_key)
    answer = classify.run(review="The kettle boils fast and looks great.", backend=online)["sentiment"]

    offline = OfflineRuntimeEndpoint(args.url, job_id="frontend-example", api_key=args.api_key)
    before = offline_requests_seen(offline)
    states = classify.run_batch([{"review": review} for review in reviews(args.n)], backend=offline,
                                num_threads=args.n)
    after = offline_requests_seen(offline)
    print(json.dumps({
        "online_answer": answer,
        "offline_answers": [state["sentiment"] for state in states],
        "offline_requests_seen": None if before is None or after is None else after - before,
    }))


if __name__ == "__main__":
    main()

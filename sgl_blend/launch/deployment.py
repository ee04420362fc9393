"""The commands that deploy sgl-blend on several GPUs or machines, written out in full.

Two shapes cover the common cases. One node with N GPUs runs one server: TP groups of ``tp`` GPUs,
``N / tp`` of them as DP ranks, and SGLang's DP controller in front; batch lines are placed on
ranks by BlendServe's DP partition, online requests by SGLang's own balancing. Several nodes run
one such server each behind SGLang's router (``sglang-router``, the ``router`` extra:
``pip install 'sgl-blend[router]'``) for online traffic; `router_argv` is its command line, the one
`tests/scale/test_router.py` runs in front of two real servers. Every node names all the others
as batch workers and all share one PostgreSQL batch store and one data directory (a shared
filesystem), so a batch submitted to any node is taken up by one of them, spread over every node
by the same partition, and taken over by another node if its coordinator dies. Nothing here
starts a cluster manager: these are the commands a user adapts to their scheduler (Slurm,
Kubernetes, ssh).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from sgl_blend.launch.flags import flag_value

ROUTER_POLICY = "cache_aware"
# The router's health check: a node that fails it twice, 5 s apart, leaves routing (the router's
# defaults, every 60 s and 3 failures, kept sending a dead node's prefixes to it for 3 minutes).
ROUTER_HEALTH_ARGS = ("--health-check-interval-secs", "5", "--health-failure-threshold", "2")


@dataclass(frozen=True)
class LaunchPlan:
    """Each step's title and argv, in the order they should start."""

    steps: list[tuple[str, list[str]]]

    def script(self) -> str:
        return "\n".join(f"# {title}\n{shlex.join(argv)}\n" for title, argv in self.steps)


def ranks_per_node(gpus: int, tp: int) -> int:
    if gpus < 1 or tp < 1:
        raise ValueError("--gpus and --tp must be at least 1")
    if gpus % tp:
        raise ValueError(f"--gpus {gpus} is not a multiple of --tp {tp}: each DP rank needs a whole TP group")
    return gpus // tp


def plan_launch(
    model: str,
    *,
    gpus: int,
    tp: int = 1,
    nodes: tuple[str, ...] = (),
    port: int = 30000,
    router_port: int = 8000,
    batch_store: str = "",
    data_dir: str = "",
    hardware: str = "",
    extra: tuple[str, ...] = (),
) -> LaunchPlan:
    """``nodes`` empty: one server on this machine; else one server per named host and a router."""
    dp = ranks_per_node(gpus, tp)
    serve = ["sgl-blend", "serve", "--model", model, "--tp-size", str(tp), "--dp-size", str(dp), "--port", str(port)]
    serve += ["--hardware", hardware] if hardware else []
    if not nodes:
        serve += ["--data-dir", data_dir] if data_dir else []
        serve += ["--batch-store", batch_store] if batch_store else []
        return LaunchPlan([(f"1 node x {gpus} GPUs: {dp} DP rank(s) x TP {tp}", serve + list(extra))])
    if not batch_store:
        raise ValueError("several nodes share one batch store: give --batch-store postgresql://...")
    if not data_dir:
        raise ValueError("several nodes share one data directory (a shared filesystem): give --data-dir")
    serve += ["--host", "0.0.0.0", "--batch-store", batch_store, "--data-dir", data_dir]
    urls = [f"http://{node}:{port}" for node in nodes]
    steps = [
        (
            f"node {index} ({node}): {dp} DP rank(s) x TP {tp}",
            serve
            + (["--batch-workers", ",".join(url for url in urls if url != own)] if len(urls) > 1 else [])
            + list(extra),
        )
        for index, (node, own) in enumerate(zip(nodes, urls))
    ]
    steps.append(
        (
            "router for online traffic (pip install 'sgl-blend[router]'); submit batches to any node",
            router_argv(urls, host="0.0.0.0", port=router_port, api_key=flag_value(extra, "--api-key")),
        )
    )
    return LaunchPlan(steps)


def router_argv(worker_urls: Sequence[str], *, host: str, port: int, api_key: str | None = None) -> list[str]:
    """SGLang's router in front of ``worker_urls``, routing by prefix (its cache-aware policy, so a
    conversation's turns meet their KV cache again). It keeps trying a worker that is not up yet,
    so it may start before the servers. With the servers' ``--api-key`` it authenticates to them."""
    argv = [
        "python",
        "-m",
        "sglang_router.launch_router",
        "--worker-urls",
        *worker_urls,
        "--policy",
        ROUTER_POLICY,
        "--host",
        host,
        "--port",
        str(port),
        *ROUTER_HEALTH_ARGS,
    ]
    return argv + (["--api-key", api_key] if api_key else [])

"""How a request is marked as offline work on its way into SGLang's scheduler.

SGLang carries a request's routing key (the ``x-smg-routing-key`` header on the OpenAI routes,
``routing_key`` in a ``/generate`` body) unchanged from the HTTP layer into the scheduler's
``Req``. sgl-blend uses that existing field instead of a new one, so no SGLang code is patched to
tell online from offline work: a key starting with ``OFFLINE_KEY_PREFIX`` is offline.
"""

from __future__ import annotations

ROUTING_KEY_HEADER = "x-smg-routing-key"
OFFLINE_KEY_PREFIX = "sgl-blend-offline"


def offline_routing_key(job_id: str = "") -> str:
    """The routing key that marks a request as offline work of one job (a batch, a run-batch file)."""
    return f"{OFFLINE_KEY_PREFIX}:{job_id}" if job_id else OFFLINE_KEY_PREFIX


def offline_headers(job_id: str = "") -> dict[str, str]:
    """HTTP headers that send an OpenAI-route request as offline work."""
    return {ROUTING_KEY_HEADER: offline_routing_key(job_id)}


def is_offline(routing_key: str | None) -> bool:
    """Whether a scheduler-side routing key marks offline work."""
    return bool(routing_key) and routing_key.startswith(OFFLINE_KEY_PREFIX)

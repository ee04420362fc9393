"""How a request is marked as offline work on its way into SGLang's scheduler.

SGLang carries a request's routing key (the ``x-smg-routing-key`` header on the OpenAI routes,
``routing_key`` in a ``/generate`` body) unchanged from the HTTP layer into the scheduler's
``Req``. sgl-blend uses that existing field instead of a new one, so no SGLang code is patched to
tell online from offline work: a key starting with ``OFFLINE_KEY_PREFIX`` is offline. A line
planned outside the engine carries its `Placement` after ``PLACEMENT_SEPARATOR``, so the
scheduler's pool admits it by the global plan.
"""

from __future__ import annotations

from sgl_blend.core.placement import Placement

ROUTING_KEY_HEADER = "x-smg-routing-key"
OFFLINE_KEY_PREFIX = "sgl-blend-offline"
PLACEMENT_SEPARATOR = "@"


def offline_routing_key(job_id: str = "", placement: Placement | None = None) -> str:
    """The routing key that marks a request as offline work of one job (a batch, a run-batch
    file), with its place in the global plan when it has one."""
    key = f"{OFFLINE_KEY_PREFIX}:{job_id}" if job_id else OFFLINE_KEY_PREFIX
    return f"{key}{PLACEMENT_SEPARATOR}{placement.encode()}" if placement is not None else key


def offline_headers(job_id: str = "", placement: Placement | None = None) -> dict[str, str]:
    """HTTP headers that send an OpenAI-route request as offline work."""
    return {ROUTING_KEY_HEADER: offline_routing_key(job_id, placement)}


def placement_of(routing_key: str | None) -> Placement | None:
    """The plan placement an offline routing key carries, if any."""
    if routing_key is None or not is_offline(routing_key) or PLACEMENT_SEPARATOR not in routing_key:
        return None
    return Placement.decode(routing_key.rsplit(PLACEMENT_SEPARATOR, 1)[1])


def is_offline(routing_key: str | None) -> bool:
    """Whether a scheduler-side routing key marks offline work."""
    return bool(routing_key and routing_key.startswith(OFFLINE_KEY_PREFIX))

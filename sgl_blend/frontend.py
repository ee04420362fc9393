"""SGLang frontend-language programs as offline work.

Run a `sgl.function` program on `OfflineRuntimeEndpoint` instead of SGLang's `RuntimeEndpoint`
and every ``/generate`` call it makes carries the offline routing key: the scheduler orders those
calls with the server's other offline work (BlendServe), and online requests go first.

SGLang's `RuntimeEndpoint` builds each ``/generate`` body inside its methods and posts it through
the ``http_request`` function of its module, with no hook for an extra field. So that function is
wrapped once: the wrapper adds the key only while an offline endpoint is the caller (a context
variable says so), and every other line that runs is SGLang's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sglang.lang.backend import runtime_endpoint
from sglang.lang.backend.runtime_endpoint import RuntimeEndpoint

from sgl_blend.offline import offline_routing_key

_routing_key: ContextVar[str | None] = ContextVar("sgl_blend_routing_key", default=None)


class _WithRoutingKey:
    """SGLang's ``http_request``, adding the routing key of the job in context to ``/generate``
    bodies; ``sgl_blend_wrapped`` marks it so that it is installed once."""

    sgl_blend_wrapped = True

    def __init__(self, http_request: Callable[..., Any]) -> None:
        self.http_request = http_request

    def __call__(self, url: str, json: Any = None, *args: Any, **kwargs: Any) -> Any:
        key = _routing_key.get()
        if key and isinstance(json, dict) and url.endswith("/generate"):
            json = {**json, "routing_key": key}
        return self.http_request(url, json, *args, **kwargs)


def _install() -> None:
    if not getattr(runtime_endpoint.http_request, "sgl_blend_wrapped", False):
        runtime_endpoint.http_request = _WithRoutingKey(runtime_endpoint.http_request)


class OfflineRuntimeEndpoint(RuntimeEndpoint):
    """A `RuntimeEndpoint` whose generation calls are offline work of the job ``job_id``."""

    def __init__(self, base_url: str, job_id: str = "frontend", **kwargs: Any) -> None:
        _install()
        super().__init__(base_url, **kwargs)
        self.routing_key = offline_routing_key(job_id)

    @contextmanager
    def _offline(self) -> Iterator[None]:
        token = _routing_key.set(self.routing_key)
        try:
            yield
        finally:
            _routing_key.reset(token)

    def generate(self, s: Any, sampling_params: Any) -> Any:
        with self._offline():
            return super().generate(s, sampling_params)

    def generate_stream(self, s: Any, sampling_params: Any) -> Iterator[Any]:
        with self._offline():
            chunks = super().generate_stream(s, sampling_params)
            first = next(chunks, None)  # the request goes out on the first step
        if first is not None:
            yield first
            yield from chunks

    def select(self, *args: Any, **kwargs: Any) -> Any:
        with self._offline():
            return super().select(*args, **kwargs)

    def cache_prefix(self, prefix_str: str) -> None:
        with self._offline():
            super().cache_prefix(prefix_str)

    def commit_lazy_operations(self, s: Any) -> None:
        with self._offline():
            super().commit_lazy_operations(s)

    def fill_image(self, s: Any) -> None:
        with self._offline():
            super().fill_image(s)

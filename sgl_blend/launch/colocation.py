"""A co-locating server's SGLang flags, from its plugin settings (`PluginSettings.sglang_flags`).

Co-location needs SGLang's mixed batches (``--enable-mixed-chunk``: offline prefill chunks ride
along with online decodes, as HyGen's Sarathi-style batches do) and the `sgl-blend` radix-cache
backend (Echo's priorities, the BlendServe annotations); bros mode runs without a radix cache. A
flag the user gives wins over these.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence

from sgl_blend.launch.flags import given_flags, with_defaults
from sgl_blend.sglang_plugin.settings import PluginSettings


def colocation_launch(settings: PluginSettings, sglang_args: Sequence[str] = ()) -> list[str]:
    """``sglang_args`` plus the flags ``settings`` run with; the server gets the same ``settings``."""
    return with_defaults(list(sglang_args), settings.sglang_flags())


def with_free_port(sglang_args: Sequence[str]) -> list[str]:
    """``sglang_args`` plus ``--port`` on a free port unless one is given: a tool that starts its own
    server must never find another server on SGLang's default port and talk to that instead."""
    if "--port" in given_flags(sglang_args):
        return list(sglang_args)
    return [*sglang_args, "--port", str(free_port())]


def free_port() -> int:
    """A port nothing on this machine listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]

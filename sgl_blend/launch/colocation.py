"""The SGLang flags a server needs for the co-location mode in its plugin settings.

Co-location needs SGLang's mixed batches (``--enable-mixed-chunk``: offline prefill chunks ride
along with online decodes, as HyGen's Sarathi-style batches do) and the `sgl-blend` radix-cache
backend (Echo's priorities, the BlendServe annotations). A flag the user gives wins over these.
"""

from __future__ import annotations

import socket
from typing import Sequence

from sgl_blend.launch.flags import given_flags, with_defaults
from sgl_blend.sglang_plugin.settings import PluginSettings

COLOCATION_FLAGS: tuple[tuple[str, str | None], ...] = (
    ("--enable-mixed-chunk", None),
    ("--radix-cache-backend", "sgl-blend"),
)
# BROS's KV layout assumes each request owns its slots, so bros mode runs without the radix cache.
BROS_FLAGS: tuple[tuple[str, str | None], ...] = (
    ("--enable-mixed-chunk", None),
    ("--disable-radix-cache", None),
)


def colocation_launch(settings: PluginSettings, sglang_args: Sequence[str] = ()) -> list[str]:
    """``sglang_args`` plus the flags ``settings.colocation`` needs (none when co-location is off);
    the server gets the same ``settings``."""
    config = settings.colocation
    flags = BROS_FLAGS if config.mode == "bros" else COLOCATION_FLAGS
    return with_defaults(list(sglang_args), flags) if config.enabled else list(sglang_args)


def with_free_port(sglang_args: Sequence[str]) -> list[str]:
    """``sglang_args`` plus ``--port`` on a free port unless one is given: a tool that starts its own
    server must never find another server on SGLang's default port and talk to that instead."""
    if "--port" in given_flags(sglang_args):
        return list(sglang_args)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return [*sglang_args, "--port", str(sock.getsockname()[1])]

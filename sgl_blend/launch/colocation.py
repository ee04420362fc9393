"""A co-locating server's SGLang flags, from its plugin settings (`PluginSettings.sglang_flags`).

Co-location needs SGLang's mixed batches (``--enable-mixed-chunk``: offline prefill chunks ride
along with online decodes, as HyGen's Sarathi-style batches do) and the `sgl-blend` radix-cache
backend (Echo's priorities, the BlendServe annotations); bros mode runs without a radix cache. A
flag the user gives wins over these.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Sequence
from pathlib import Path

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


# Binding port 0 hands out a port of the kernel's ephemeral range, and any outgoing connection
# may take that port as its local end in the seconds before the server binds it: a test run lost a
# server to exactly that ("address already in use"). Ports are drawn below that range instead.
LOWEST_PORT = 10000
PORT_TRIES = 64
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# Not the shared `random` state: two processes seeded alike would draw the same ports.
_PORT_DRAW = random.SystemRandom()


def free_port() -> int:
    """A port nothing on this machine has bound now, below the ephemeral range where the kernel
    says what that is (else, or when all those tried are taken, one the kernel picks)."""
    below = range(LOWEST_PORT, _ephemeral_low())
    for port in [*_PORT_DRAW.sample(below, min(PORT_TRIES, len(below))), 0]:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise OSError("no free port on 127.0.0.1")


def _ephemeral_low() -> int:
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return LOWEST_PORT

"""User flags pass through unchanged; CPU defaults fill only what the user left out."""

from __future__ import annotations

import socket

from sgl_blend.launch.flags import CPU_DEFAULT_FLAGS, flag_value, with_defaults


def test_user_flags_win_over_defaults() -> None:
    argv = with_defaults(["--host=0.0.0.0", "--max-total-tokens", "4096", "--tp-size", "2"], CPU_DEFAULT_FLAGS)
    assert flag_value(argv, "--host") == "0.0.0.0"
    assert flag_value(argv, "--max-total-tokens") == "4096"
    assert flag_value(argv, "--tp-size") == "2"
    assert argv.count("--max-total-tokens") == 1
    assert flag_value(argv, "--attention-backend") == "torch_native"
    assert "--sleep-on-idle" in argv


def test_defaults_are_added_once() -> None:
    argv = with_defaults(with_defaults([], CPU_DEFAULT_FLAGS), CPU_DEFAULT_FLAGS)
    assert argv.count("--device") == 1


def test_a_free_port_is_unbound_and_below_the_range_outgoing_connections_take_ports_from() -> None:
    """A server binds its port seconds after it is chosen; a port of the ephemeral range may be
    the local end of any connection made meanwhile. A port chosen while the ones before it are
    bound is another."""
    from sgl_blend.launch import colocation

    low = int(colocation.EPHEMERAL_RANGE.read_text().split()[0])
    held = []
    for _ in range(8):
        port = colocation.free_port()
        assert colocation.LOWEST_PORT <= port < low
        sock = socket.socket()
        sock.bind(("127.0.0.1", port))  # unbound when chosen: binds; held, so not chosen again
        held.append(sock)
    assert len({sock.getsockname()[1] for sock in held}) == 8
    for sock in held:
        sock.close()

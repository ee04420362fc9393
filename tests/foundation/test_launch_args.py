"""User flags pass through unchanged; CPU defaults fill only what the user left out."""

from __future__ import annotations

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

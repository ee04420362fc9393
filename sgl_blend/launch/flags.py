"""SGLang command-line arguments as sgl-blend starts them: user flags plus the CPU defaults.

Every SGLang flag the user gives passes through unchanged; a CPU default is added only where the
user did not give that flag. The defaults are what SGLang 0.5.23 needs to run well on a CPU:
the torch-native attention backend, a bounded KV pool (the default memory fraction would take
~15 GB of RAM), sleeping when idle (an idle scheduler otherwise burns a core), and loopback only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import overload

CPU_ENV = {"SGLANG_USE_CPU_ENGINE": "1"}
CPU_THREADS_BIND_ENV = "SGLANG_CPU_OMP_THREADS_BIND"
CPU_DEFAULT_FLAGS: tuple[tuple[str, str | None], ...] = (
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--max-total-tokens", "65536"),
    ("--sleep-on-idle", None),
    ("--host", "127.0.0.1"),
    ("--skip-server-warmup", None),
)


def given_flags(argv: Sequence[str]) -> set[str]:
    """The ``--flag`` names present in argv, in either ``--flag value`` or ``--flag=value`` form."""
    return {arg.split("=", 1)[0] for arg in argv if arg.startswith("--")}


def with_defaults(argv: Sequence[str], defaults: Sequence[tuple[str, str | None]]) -> list[str]:
    present = given_flags(argv)
    extended = list(argv)
    for flag, value in defaults:
        if flag not in present:
            extended += [flag] if value is None else [flag, value]
    return extended


@overload
def flag_value(argv: Sequence[str], flag: str, default: str) -> str: ...


@overload
def flag_value(argv: Sequence[str], flag: str, default: None = None) -> str | None: ...


def flag_value(argv: Sequence[str], flag: str, default: str | None = None) -> str | None:
    """The value of ``flag`` in argv (last occurrence wins, as in argparse)."""
    value = default
    for index, arg in enumerate(argv):
        if arg == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def cpu_thread_binding(ranks: int, cpus: Iterable[int]) -> str:
    """A ``SGLANG_CPU_OMP_THREADS_BIND`` value giving each of ``ranks`` scheduler processes its own
    cores: contiguous equal groups, or, with more ranks than cores, one core each in turn. SGLang
    otherwise wants one NUMA node per rank, and a small machine has one node."""
    ordered = sorted(cpus)
    if not ordered or ranks < 1:
        raise ValueError("need at least one rank and one core")
    if ranks > len(ordered):
        return "|".join(str(ordered[rank % len(ordered)]) for rank in range(ranks))
    size = len(ordered) // ranks
    groups = [ordered[rank * size : (rank + 1) * size] for rank in range(ranks)]
    return "|".join(",".join(str(cpu) for cpu in group) for group in groups)

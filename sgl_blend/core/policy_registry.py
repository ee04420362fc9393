"""Every offline-ordering name sgl-blend accepts: what it is and where it runs.

`sgl-blend serve --offline-policy`, `run-batch --policy` and `sim --policy` take their choices
from here, so a name means one ordering wherever it is given. ``fcfs`` is the plugin's arrival
order in every surface (the same pool, prefill cap and engine flags as BlendServe), never
SGLang's ordering with the plugin off; ``lpm``, ``sglang-fcfs`` and ``sglang-dfs-weight`` are
SGLang's own orders, which the engine runs itself (the plugin's pool stays out), so a user can
compare BlendServe with them on the same engine; the simulator models ``lpm``. BlendServe's two
ablations run everywhere, with BlendServe's plan, pool and engine flags, so a report can show on the
engine what each of its mechanisms adds; the other ablations exist only in the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVE, RUN_BATCH, SIM = "serve", "run-batch", "sim"
EVERYWHERE = frozenset((SERVE, RUN_BATCH, SIM))


@dataclass(frozen=True)
class PolicyEntry:
    """``in_plugin``: the plugin's offline pool orders the work (else SGLang's
    ``--schedule-policy`` named by ``sglang_schedule`` does, or the user's, when None).
    ``planned``: run-batch and the Batch API plan every line before the engine sees it.
    ``blends``: the plan blends compute- and memory-heavy work where the device's measured overlap
    lets blending pay (else it is the DFS order with one cursor).
    ``base``/``paced``/``one_cursor``/``shuffled``: an ablation of another entry -- its policy
    with pacing set to ``paced`` (None: the base's own), its plan's order walked by one cursor
    from the compute-heavy end (no dual scan), or its lines submitted in a seeded shuffle."""

    name: str
    summary: str
    surfaces: frozenset[str]
    in_plugin: bool = True
    sglang_schedule: str | None = "fcfs"
    planned: bool = False
    blends: bool = False
    base: str | None = None
    paced: bool | None = None
    one_cursor: bool = False
    shuffled: bool = False

    @property
    def core_policy(self) -> str:
        """The core policy class that runs this entry."""
        return self.base or self.name

    def policy_options(self) -> dict[str, bool]:
        """What the entry sets on its core policy (`PlannedPolicy`'s keywords)."""
        options = {} if self.paced is None else {"paced": self.paced}
        return {**options, "one_cursor": True} if self.one_cursor else options


ENTRIES = (
    PolicyEntry(
        "blendserve",
        "BlendServe: resource-aware prefix tree, dual-scan admission (DFS order with one "
        "cursor where the device's overlap makes blending lose)",
        EVERYWHERE,
        planned=True,
        blends=True,
    ),
    PolicyEntry(
        "dfs",
        "the exact DFS order of the global prefix tree: most prefix sharing, no blending",
        EVERYWHERE,
        planned=True,
    ),
    PolicyEntry("fcfs", "arrival order, through the plugin's pool", EVERYWHERE),
    PolicyEntry("random", "a seeded random order, through the plugin's pool", EVERYWHERE),
    PolicyEntry(
        "psm",
        "HyGen's prefix-sharing maximisation with a fairness utility (--psm-utility)",
        frozenset((SERVE, RUN_BATCH)),
    ),
    PolicyEntry(
        "lpm",
        "SGLang's own longest-prefix-match order; the plugin's pool stays out",
        EVERYWHERE,
        in_plugin=False,
        sglang_schedule="lpm",
    ),
    PolicyEntry(
        "sglang-fcfs",
        "SGLang's own first-come-first-served order; the plugin's pool stays out",
        frozenset((SERVE, RUN_BATCH)),
        in_plugin=False,
        sglang_schedule="fcfs",
    ),
    PolicyEntry(
        "sglang-dfs-weight",
        "SGLang's own DFS-weight order over its radix tree; the plugin's pool stays out",
        frozenset((SERVE, RUN_BATCH)),
        in_plugin=False,
        sglang_schedule="dfs-weight",
    ),
    PolicyEntry(
        "off",
        "the plugin leaves ordering to SGLang (its --schedule-policy)",
        frozenset((SERVE,)),
        in_plugin=False,
        sglang_schedule=None,
    ),
    PolicyEntry(
        "dfs+pacing",
        "ablation: DFS order admitted at BlendServe's pace",
        frozenset((SIM,)),
        planned=True,
        base="dfs",
        paced=True,
    ),
    PolicyEntry(
        "blendserve-order",
        "ablation: BlendServe's order and dual scan without its pacing",
        EVERYWHERE,
        planned=True,
        blends=True,
        base="blendserve",
        paced=False,
    ),
    PolicyEntry(
        "blendserve-serial",
        "ablation: BlendServe's order walked by one cursor from its compute-heavy end, "
        "without its dual scan and pacing (what blending itself adds)",
        EVERYWHERE,
        planned=True,
        blends=True,
        base="blendserve",
        paced=False,
        one_cursor=True,
    ),
    PolicyEntry(
        "fcfs-shuffled",
        "ablation: arrival order over a seeded shuffle of the workload",
        frozenset((SIM,)),
        base="fcfs",
        shuffled=True,
    ),
)
REGISTRY: dict[str, PolicyEntry] = {entry.name: entry for entry in ENTRIES}


def names_for(surface: str) -> tuple[str, ...]:
    """The names a surface accepts, in the registry's order."""
    return tuple(entry.name for entry in ENTRIES if surface in entry.surfaces)


def lookup(name: str, surface: str) -> PolicyEntry:
    """The entry for ``name`` on ``surface``; the error lists what that surface accepts."""
    entry = REGISTRY.get(name)
    if entry is None or surface not in entry.surfaces:
        raise ValueError(f"unknown policy {name!r} for {surface}; known: {', '.join(names_for(surface))}")
    return entry


def describe(surface: str) -> str:
    """One line per name, for ``--help``."""
    return "; ".join(f"{entry.name}: {entry.summary}" for entry in ENTRIES if surface in entry.surfaces)

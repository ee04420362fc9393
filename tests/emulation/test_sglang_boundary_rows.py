"""The emulation reaches SGLang only through the plugin's boundary table, whose rows the installed
SGLang has (`tests/foundation/test_sglang_boundary.py` checks the whole table); the sizing's copy of
SGLang's prefill-graph buckets is SGLang's own."""

from __future__ import annotations

import inspect

import pytest

from sgl_blend.emulation.memory import prefill_graph_buckets
from sgl_blend.emulation.sglang_forward import Boundary
from sgl_blend.sglang_plugin import sglang_boundary
from sgl_blend.sglang_plugin.boundary_check import check_boundary


def test_the_plugins_boundary_is_what_the_emulation_uses() -> None:
    members = [name for name, _ in inspect.getmembers(Boundary) if not name.startswith("_")]
    members += list(Boundary.__annotations__)
    missing = [name for name in members if name not in sglang_boundary.NAMES and not hasattr(sglang_boundary, name)]
    assert missing == []
    rows = (sglang_boundary.EMULATED_FORWARD, sglang_boundary.EMULATION_NO_BATCH, sglang_boundary.GET_INTERNAL_STATE)
    assert all(row in sglang_boundary.HOOKS for row in rows)
    emulation_names = {name: sglang_boundary.NAMES[name] for name in ("GenerationBatchResult", "LogitsProcessorOutput")}
    emulation_surfaces = [row for row in sglang_boundary.SURFACES if "scheduled" in row.reached.split()
                          or any(reach.startswith("scheduled.") for reach in row.reached.split())]
    assert check_boundary(names=emulation_names, hooks=rows, calls=(), surfaces=emulation_surfaces) == []


@pytest.mark.parametrize("max_bs", [8, 512, 4096, 8192, 16384])
def test_prefill_graph_buckets_are_sglangs(max_bs: int) -> None:
    from sglang.srt.arg_groups.cuda_graph_hook import generate_prefill_cuda_graph_batch_sizes

    assert prefill_graph_buckets(max_bs) == generate_prefill_cuda_graph_batch_sizes(max_bs)

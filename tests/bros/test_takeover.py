"""Which BE requests give KV to an RT request short of memory, in an engine without blocks."""

from __future__ import annotations

from types import SimpleNamespace

from sgl_blend.core.bros.takeover import Take, plan_takeover
from sgl_blend.sglang_plugin.slot_takeover import admission_shortfall


def test_held_requests_give_before_running_ones_the_roomiest_first_and_no_more_than_wanted() -> None:
    takes = plan_takeover(130, held={"small": 40, "big": 100}, running={"run": 500})
    assert takes == [Take("big", 100, False), Take("small", 30, False)]


def test_running_requests_give_only_when_the_held_ones_are_not_enough() -> None:
    takes = plan_takeover(200, held={"held": 50}, running={"short": 60, "long": 300})
    assert takes == [Take("held", 50, False), Take("long", 150, True)]


def test_everything_takeable_when_it_is_not_enough_and_nothing_when_nothing_is_wanted() -> None:
    assert plan_takeover(1000, held={"a": 10, "empty": 0}, running={"b": 20}) == [Take("a", 10, False), Take("b", 20, True)]
    assert plan_takeover(0, held={"a": 10}, running={"b": 20}) == []


def test_an_admission_shortfall_is_whole_slots_when_sglangs_budget_is_fractional() -> None:
    """SGLang's remaining total turns fractional once running requests reserve their future
    tokens at its new-token ratio (a mid-run state a short server test does not reach, hence the
    stand-in adder). A fractional shortfall reached the KV checkpoint as a slice bound and raised,
    which switched BROS off in the emulated judge."""
    sampling = SimpleNamespace(ignore_eos=True, max_new_tokens=4)
    req = SimpleNamespace(full_untruncated_fill_ids=[0] * 100, prefix_len=0, sampling_params=sampling,
                          output_ids=[], origin_input_ids=[0] * 100)
    adder = SimpleNamespace(tree_cache=SimpleNamespace(disable=True), ceil_paged_tokens=lambda tokens: tokens,
                            per_req_token_overhead=0, cur_rem_tokens=80, rem_total_tokens=60.4, new_token_ratio=0.4,
                            running_batch=SimpleNamespace(reqs=[]), can_run_list=[])
    need = admission_shortfall(adder, req)
    assert isinstance(need, int) and need >= 40  # 100 new slots against 60.4 left

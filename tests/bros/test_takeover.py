"""Which BE requests give KV to an RT request short of memory, in an engine without blocks."""

from __future__ import annotations

from sgl_blend.core.bros.takeover import Take, plan_takeover


def test_held_requests_give_before_running_ones_the_roomiest_first_and_no_more_than_wanted() -> None:
    takes = plan_takeover(130, held={"small": 40, "big": 100}, running={"run": 500})
    assert takes == [Take("big", 100, False), Take("small", 30, False)]


def test_running_requests_give_only_when_the_held_ones_are_not_enough() -> None:
    takes = plan_takeover(200, held={"held": 50}, running={"short": 60, "long": 300})
    assert takes == [Take("held", 50, False), Take("long", 150, True)]


def test_everything_takeable_when_it_is_not_enough_and_nothing_when_nothing_is_wanted() -> None:
    assert plan_takeover(1000, held={"a": 10, "empty": 0}, running={"b": 20}) == [Take("a", 10, False), Take("b", 20, True)]
    assert plan_takeover(0, held={"a": 10}, running={"b": 20}) == []

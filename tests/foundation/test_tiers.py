"""The test tiers of tests/conftest.py: a test that starts a server is found and marked ``server``,
however indirectly its source does it, and one that starts a server unmarked fails at once."""

from __future__ import annotations

import pytest

from sgl_blend.launch import supervisor
from tests.conftest import SERVER, _starts_server


def starts_one() -> None:  # never called: only its source is read
    supervisor.start_server("tiny-llama")


def through_a_helper() -> None:
    starts_one()


def runs_the_job_command() -> list[str]:
    return ["python", "-m", "sgl_blend.cli", "run-batch", "-i", "in.jsonl"]


def only_plans() -> list[str]:
    return ["sgl-blend", "serve", "--model", "m"]  # a printed command, nothing started


def test_server_starts_are_found_through_the_module_s_own_helpers() -> None:
    assert _starts_server(starts_one) and _starts_server(through_a_helper)
    assert _starts_server(runs_the_job_command)
    assert not _starts_server(only_plans)


def test_an_unmarked_test_cannot_start_a_server(request: pytest.FixtureRequest) -> None:
    """Under another name the collection hook cannot see the call; the checked supervisor still
    refuses it before anything starts (the model does not exist either, so nothing could start)."""
    assert request.node.get_closest_marker(SERVER) is None
    launcher = supervisor.start_server
    with pytest.raises(pytest.fail.Exception, match="is not marked `server`"):
        launcher("no-such-model")

"""The test tiers of tests/conftest.py: a test that starts a server unmarked fails at once."""

from __future__ import annotations

import pytest

from sgl_blend.launch import supervisor
from tests.conftest import SERVER


def test_an_unmarked_test_cannot_start_a_server(request: pytest.FixtureRequest) -> None:
    """The checked supervisor refuses it before anything starts (the model does not exist either,
    so nothing could start)."""
    assert request.node.get_closest_marker(SERVER) is None
    launcher = supervisor.start_server
    with pytest.raises(pytest.fail.Exception, match="is not marked `server`"):
        launcher("no-such-model")

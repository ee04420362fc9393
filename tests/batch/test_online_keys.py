"""Once a server has any key, every route takes one: a server with only the Batch API's keys, or
only SGLang's ``--admin-api-key``, serves nobody without a key on SGLang's online routes either,
and a team's key works there as on its batches (`server.key_gate`). Two servers, one per way of
configuring keys that SGLang alone would leave open; a server with SGLang's ``--api-key`` beside
team keys is `test_api_in_front`'s, one without keys `test_plan_ids`'s."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.server.config import BatchApiConfig
from tests.batch.key_checks import assert_only_keys_pass
from tests.conftest import free_port

pytestmark = pytest.mark.server

TEAM_A, TEAM_B, ADMIN_KEY = "sk-team-a", "sk-team-b", "sk-admin"


def keyed(tmp_path_factory: pytest.TempPathFactory, sglang_args: list[str], team_keys: tuple[str, ...] = ()
          ) -> ServerProcess:
    root = tmp_path_factory.mktemp("keys")
    return start_server("tiny-llama", ["--port", str(free_port()), *sglang_args], log_path=root / "server.log",
                        batch_api=BatchApiConfig(data_dir=root / "data", api_keys=team_keys))


@pytest.fixture(scope="module")
def teams_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = keyed(tmp_path_factory, [], (TEAM_A, TEAM_B))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def admin_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = keyed(tmp_path_factory, ["--admin-api-key", ADMIN_KEY])
    yield server
    server.stop()


def test_team_keys_alone_close_every_route_and_open_it_to_each_team(teams_server: ServerProcess) -> None:
    assert_only_keys_pass(teams_server.base_url, (TEAM_A, TEAM_B))


def test_the_admin_key_alone_closes_every_route(admin_server: ServerProcess) -> None:
    assert_only_keys_pass(admin_server.base_url, (ADMIN_KEY,))

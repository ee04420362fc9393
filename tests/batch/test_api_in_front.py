"""The Batch API answers in front of SGLang's own middleware, on a real server with SGLang's
``--api-key`` and ``--admin-api-key`` and two Batch API keys: each batch key runs its own batch,
whose results only it (and the admin) can read; every key works on SGLang's routes too, whose
admin routes keep taking the admin key alone, and which keep SGLang's CORS. Its own server, since
the keys are part of how it starts."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from sgl_blend.client import http
from sgl_blend.launch.supervisor import ServerProcess, start_server
from sgl_blend.server.config import BatchApiConfig
from tests.batch.helpers import chat_lines, create_batch, records, wait_until
from tests.batch.key_checks import assert_only_keys_pass
from tests.conftest import free_port

pytestmark = pytest.mark.server

ENGINE_KEY, ADMIN_KEY, TEAM_A, TEAM_B = "sk-engine", "sk-admin", "sk-team-a", "sk-team-b"


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("keyed")
    config = BatchApiConfig(data_dir=root / "data", api_keys=(TEAM_A, TEAM_B))
    server = start_server("tiny-llama", ["--port", str(free_port()), "--api-key", ENGINE_KEY,
                                         "--admin-api-key", ADMIN_KEY], log_path=root / "server.log", batch_api=config)
    yield server
    server.stop()


def client(server: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=key, max_retries=0)


def test_each_key_runs_and_reads_only_its_own_batches(keyed_server: ServerProcess) -> None:
    team_a, team_b, admin = (client(keyed_server, key) for key in (TEAM_A, TEAM_B, ADMIN_KEY))
    lines = chat_lines(3, "team-a")
    batch = wait_until(team_a, create_batch(team_a, lines).id)
    assert batch.status == "completed" and len(records(team_a, batch.output_file_id)) == len(lines)

    with pytest.raises(openai.NotFoundError):
        team_b.files.content(batch.output_file_id)  # results belong to the batch's key
    with pytest.raises(openai.NotFoundError):
        team_b.batches.retrieve(batch.id)
    assert batch.id in {listed.id for listed in admin.batches.list()}
    assert len(records(admin, batch.output_file_id)) == len(lines)
    assert client(keyed_server, ENGINE_KEY).batches.list().data == []  # SGLang's key is one more user


def test_every_key_works_on_sglangs_routes(keyed_server: ServerProcess) -> None:
    assert_only_keys_pass(keyed_server.base_url, (TEAM_A, TEAM_B, ENGINE_KEY, ADMIN_KEY))


def test_sglangs_admin_routes_take_the_admin_key_alone(keyed_server: ServerProcess) -> None:
    flush = keyed_server.base_url + "/flush_cache"
    for key in (TEAM_A, ENGINE_KEY):
        refused = httpx.post(flush, headers=http.auth_headers(key), timeout=60)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key", key
    assert httpx.post(flush, headers=http.auth_headers(ADMIN_KEY), timeout=60).status_code == 200


def test_sglang_routes_keep_sglangs_cors(keyed_server: ServerProcess) -> None:
    web = {**http.auth_headers(ENGINE_KEY), "Origin": "https://evil.example"}
    assert httpx.get(keyed_server.base_url + "/v1/models", headers=web).status_code == 200
    assert httpx.get(keyed_server.base_url + "/v1/batches", headers=web).status_code == 403

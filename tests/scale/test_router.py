"""A real deployment of two nodes on this machine: two `sgl-blend serve` processes sharing one
PostgreSQL batch store and one data directory, each naming the other as a batch worker, behind
SGLang's router started with the command line `sgl-blend launch` prints (`router_argv`).

Online requests go through the router. A batch submitted to the second server runs on both;
then the server that is not coordinating it is killed (its `serve` process, SIGKILL) mid-batch:
its unfinished lines move to the survivor, the batch completes with 0 violations, and the router
keeps answering online requests from the survivor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from sgl_blend.launch.deployment import router_argv
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.store import BatchStore
from tests.batch.helpers import create_batch, wait_until
from tests.batch.postgres import new_database
from tests.conftest import free_port
from tests.faults.invariants import violations
from tests.scale.lines import family_lines
from tests.waiting import wait_for

pytestmark = pytest.mark.server

API_KEY = "sk-two-nodes"


def serve(port: int, other: int, store_url: str, data_dir: Path, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "sgl_blend.cli", "serve", "--model", "tiny-llama",
                                 "--port", str(port), "--api-key", API_KEY, "--batch-store", store_url,
                                 "--data-dir", str(data_dir), "--batch-workers", f"http://127.0.0.1:{other}",
                                 "--worker-grace", "2"], stdout=out, stderr=subprocess.STDOUT)


def answers(url: str, path: str = "/health") -> bool:
    try:
        return httpx.get(url + path, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def chat(client: openai.OpenAI, index: int) -> str | None:
    """An online request; its finish reason (None would be no answer)."""
    reply = client.chat.completions.create(model="tiny-llama", max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": f"online question {index}"}])
    return reply.choices[0].finish_reason


@pytest.fixture()
def deployment(tmp_path: Path, postgres_url: str) -> Iterator[dict]:
    ports = [free_port(), free_port()]
    store_url = new_database(postgres_url, "two_nodes")
    servers = [serve(ports[0], ports[1], store_url, tmp_path / "shared", tmp_path / "node0.log"),
               serve(ports[1], ports[0], store_url, tmp_path / "shared", tmp_path / "node1.log")]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    router_url, router = f"http://127.0.0.1:{free_port()}", None
    try:
        for server, url in zip(servers, urls):
            wait_for(lambda: server.poll() is None and answers(url), f"{url} to be healthy")
        argv = router_argv(urls, host="127.0.0.1", port=int(router_url.rsplit(":", 1)[1]), api_key=API_KEY)
        with (tmp_path / "router.log").open("ab") as out:
            router = subprocess.Popen([sys.executable, *argv[1:]], stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: router.poll() is None and answers(router_url, "/v1/models"), "the router to route")
        yield {"servers": servers, "urls": urls, "router": router_url, "store_url": store_url,
               "data_dir": tmp_path / "shared"}
    finally:
        for process in (router, *servers):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in (router, *servers):
            if process is not None:
                process.wait(timeout=120)


def test_two_servers_behind_the_router_share_a_batch_and_survive_a_kill(deployment: dict) -> None:
    urls, servers = deployment["urls"], deployment["servers"]
    online = openai.OpenAI(base_url=deployment["router"] + "/v1", api_key=API_KEY, max_retries=0)
    assert all(chat(online, index) for index in range(4))

    second = openai.OpenAI(base_url=urls[1] + "/v1", api_key=API_KEY, max_retries=0)
    lines = family_lines(4, 8, short=2, long=96, prefix="node")
    batch_id = create_batch(second, lines).id
    store = BatchStore.open(deployment["store_url"], deployment["data_dir"] / "probe")
    try:
        def ran_on_both() -> set[str] | None:
            done = {line.worker for line in store.lines(batch_id) if line.state == "completed"}
            return done if done == set(urls) else None

        wait_for(ran_on_both, "lines of the batch to complete on both servers")
        running = store.get_batch(batch_id)
        assert running.status == "in_progress", "the kill comes mid-batch"
        coordinator = running.owner
        victim = next(index for index, url in enumerate(urls) if not coordinator.endswith(":" + url.rsplit(":", 1)[1]))
        os.kill(servers[victim].pid, signal.SIGKILL)
        servers[victim].wait()

        survivor = openai.OpenAI(base_url=urls[1 - victim] + "/v1", api_key=API_KEY, max_retries=0)
        assert wait_until(survivor, batch_id).status == "completed"
        assert violations(store, BlobDir(deployment["data_dir"]), batch_id, [line["custom_id"] for line in lines]) == []
    finally:
        store.close()

    def routed_around() -> bool:
        try:
            return all(chat(online, index) for index in range(4))
        except openai.APIError:
            return False

    wait_for(routed_around, "the router to route online requests around the dead node")

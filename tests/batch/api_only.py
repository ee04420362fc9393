"""The Batch API's routes on a real HTTP server of their own, without SGLang or a runner: for tests
of what the routes themselves promise (keys, owners, browser origins, size caps, hostile bodies),
which need no engine. Run as ``python -m tests.batch.api_only CONFIG_JSON PORT``: the config is a
`BatchApiConfig`'s JSON plus ``user_keys`` and ``admin_key``. The test process starts it as a
process of its own, so that its peak memory can be read from the kernel."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Iterator

import httpx
import uvicorn

from sgl_blend.server.app import batch_api_app
from sgl_blend.server.auth import BatchKeys
from sgl_blend.server.blobs import BlobDir
from sgl_blend.server.config import BatchApiConfig
from sgl_blend.server.routes import ApiContext
from sgl_blend.server.store import BatchStore
from tests.conftest import free_port
from tests.waiting import wait_for


@contextmanager
def api_only_server(config: BatchApiConfig, keys: BatchKeys, log: Path) -> Iterator[tuple[str, int]]:
    """(base URL, pid) of a running API-only server; stopped on exit."""
    port = free_port()
    values = {**asdict(config), "data_dir": str(config.data_dir), "user_keys": keys.user_keys,
              "admin_key": keys.admin_key}
    with log.open("ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "tests.batch.api_only", json.dumps(values), str(port)],
                                   stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert process.poll() is None, f"the API-only server exited; see {log}"
        try:
            return httpx.get(url + "/v1/batches", timeout=5).status_code in (200, 401)
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, "the API-only server to answer")
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)


def main() -> None:
    values, port = json.loads(sys.argv[1]), int(sys.argv[2])
    keys = BatchKeys(tuple(values.pop("user_keys")), values.pop("admin_key"))
    values["data_dir"] = Path(values["data_dir"])
    for name in ("workers", "api_keys", "cors_origins"):
        values[name] = tuple(values[name])
    config = BatchApiConfig(**values)
    context = ApiContext(config, BatchStore.open(config.store_url, config.data_dir), BlobDir(config.data_dir),
                         wake_runner=lambda: None)
    uvicorn.run(batch_api_app(context, keys), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()

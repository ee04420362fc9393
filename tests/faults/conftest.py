"""The fault tests reuse the Batch API tests' shared tiny-llama server (as the engine their runners
send lines to) and their PostgreSQL server."""

from tests.batch.conftest import batch_server, batch_store_url, batch_work_dir, postgres_url

__all__ = ["batch_server", "batch_store_url", "batch_work_dir", "postgres_url"]

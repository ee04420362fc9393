"""The scale-out tests reuse the Batch API tests' real PostgreSQL server."""

from tests.batch.conftest import postgres_url

__all__ = ["postgres_url"]

"""The Batch API's settings, and how `sgl-blend serve` hands them to the server process.

They travel as one JSON environment variable because SGLang parses the server's argv itself and
would reject flags it does not know.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sgl_blend.batch_lines.bodies import DEFAULT_MAX_N, DEFAULT_MAX_TOKENS
from sgl_blend.batch_lines.lines import DEFAULT_MAX_LINE_BYTES

CONFIG_ENV = "SGLBLEND_BATCH_API"
DATA_DIR_ENV = "SGLBLEND_DATA_DIR"
# OpenAI's own limits for a batch input file.
DEFAULT_MAX_FILE_LINES = 50_000
DEFAULT_MAX_FILE_BYTES = 200 * 1024 * 1024
DEFAULT_WORKER_GRACE_S = 15.0


def default_data_dir() -> Path:
    """``$SGLBLEND_DATA_DIR``, else ``$XDG_DATA_HOME/sgl-blend``, else ``~/.local/share/sgl-blend``."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "sgl-blend"


@dataclass(frozen=True)
class BatchApiConfig:
    """``store_url`` empty means SQLite in ``data_dir``. ``workers``: other servers' base URLs that
    this server's batch runner also sends lines to (it always uses itself); ``worker_grace_s``: how
    long a worker may stay unreachable before its unfinished lines move to the others.
    ``api_keys``: the Batch API's own user keys (beside SGLang's ``--api-key``); ``cors_origins``:
    the web origins browsers may call the Batch API from; ``max_n`` and ``max_tokens``: the caps
    on what one line may ask for (`batch_lines.bodies`). ``named``: files stored outside
    ``data_dir`` (file id -> path): a `sgl-blend run-batch` job's input, output and error files,
    which are the user's own."""

    data_dir: Path = field(default_factory=default_data_dir)
    store_url: str = ""
    max_file_lines: int = DEFAULT_MAX_FILE_LINES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_inflight: int | None = None
    workers: tuple[str, ...] = ()
    worker_grace_s: float = DEFAULT_WORKER_GRACE_S
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_n: int = DEFAULT_MAX_N
    max_tokens: int = DEFAULT_MAX_TOKENS
    named: dict[str, Path] = field(default_factory=dict)

    def to_env(self) -> dict[str, str]:
        values = asdict(self)
        values["data_dir"] = str(Path(self.data_dir).resolve())
        values["named"] = {file_id: str(Path(path).resolve()) for file_id, path in self.named.items()}
        return {CONFIG_ENV: json.dumps(values)}

    @classmethod
    def from_env(cls) -> BatchApiConfig | None:
        """The configuration `sgl-blend serve` passed, or None when the Batch API is not wanted."""
        text = os.environ.get(CONFIG_ENV)
        if not text:
            return None
        values = json.loads(text)
        values["data_dir"] = Path(values["data_dir"])
        values["named"] = {file_id: Path(path) for file_id, path in values.get("named", {}).items()}
        for name in ("workers", "api_keys", "cors_origins"):
            values[name] = tuple(values.get(name, ()))
        return cls(**values)

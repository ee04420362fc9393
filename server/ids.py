"""Object ids: unguessable, and the only thing a file's path on disk is ever made from.

A request's id is checked against the exact shape the server generates before it reaches the store
or the disk, so no client text can name a path.
"""

from __future__ import annotations

import re
import secrets

FILE_PREFIX = "file-"
BATCH_PREFIX = "batch_"
_TOKEN_HEX_CHARS = 32
_FILE_ID = re.compile(rf"{FILE_PREFIX}[0-9a-f]{{{_TOKEN_HEX_CHARS}}}")
_BATCH_ID = re.compile(rf"{BATCH_PREFIX}[0-9a-f]{{{_TOKEN_HEX_CHARS}}}")


def new_file_id() -> str:
    return FILE_PREFIX + secrets.token_hex(_TOKEN_HEX_CHARS // 2)


def new_batch_id() -> str:
    return BATCH_PREFIX + secrets.token_hex(_TOKEN_HEX_CHARS // 2)


def is_file_id(text: str) -> bool:
    return bool(_FILE_ID.fullmatch(text))


def is_batch_id(text: str) -> bool:
    return bool(_BATCH_ID.fullmatch(text))

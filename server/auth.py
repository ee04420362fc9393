"""Who is calling the Batch API: the bearer key of a request, and what it may see.

Files and batches belong to the key that created them (the store records `key_owner` of the key,
a hash): another key's objects do not exist for a caller, and reading one gets 404, as for an id
that was never made. The admin key (SGLang's ``--admin-api-key``) sees and manages everyone's.
The user keys are SGLang's ``--api-key`` and the Batch API's own (``--batch-api-keys``,
``--batch-api-keys-file``), so several teams can share one server without seeing each other's
work. A server with no key at all is a single-user server: everything is everyone's. A server
with only the admin key is not open: it takes the admin key alone. The same keys guard SGLang's
own routes (`server.key_gate`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sgl_blend.server.errors import ApiError
from sgl_blend.server.store import key_owner


@dataclass(frozen=True)
class Caller:
    """``owner``: what objects the caller creates are recorded as (None on a keyless server);
    ``sees_all``: whether the caller sees every owner's objects (the admin, or a keyless server)."""

    owner: str | None
    sees_all: bool

    @property
    def scope(self) -> str | None:
        """The owner filter the caller's reads go through (None: no filter)."""
        return None if self.sees_all else self.owner


@dataclass(frozen=True)
class BatchKeys:
    """The keys the Batch API takes: ``user_keys`` each see their own objects, ``admin_key`` all."""

    user_keys: tuple[str, ...] = ()
    admin_key: str | None = None

    def caller(self, authorization: str | None) -> Caller:
        """The caller an ``Authorization`` header names; `ApiError` 401 when it names none."""
        if not self.user_keys and not self.admin_key:
            return Caller(None, sees_all=True)
        token = _bearer(authorization)
        if token is not None:
            if self.admin_key and secrets.compare_digest(token.encode(), self.admin_key.encode()):
                return Caller(key_owner(token), sees_all=True)
            # Compare with every key (not stopping at a match), so timing does not say which matched.
            matches = [secrets.compare_digest(token.encode(), key.encode()) for key in self.user_keys]
            if any(matches):
                return Caller(key_owner(token), sees_all=False)
        raise ApiError(
            401,
            "Incorrect API key provided: send a key this server accepts as 'Authorization: Bearer KEY'",
            code="invalid_api_key",
        )


def _bearer(authorization: str | None) -> str | None:
    scheme, _, token = (authorization or "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None

"""Client API keys: which tenant (or admin) a request's key names, compared in constant time."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from budgetproxy.config import AuthConfig


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is from: a tenant's client (None: the default tenant), or an admin."""

    tenant: str | None = None
    admin: bool = False


OPEN = Principal()  # every request, when no key is configured


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


class KeyRing:
    """The configured keys. A request's key (`Authorization: Bearer <key>`, or Anthropic
    clients' `x-api-key: <key>`) is hashed once and compared with every key's hash
    (hmac.compare_digest, no early exit): how long the check takes says nothing about which
    key, or how much of one, matched."""

    def __init__(self, keys: Iterable[tuple[str, str | None]], admin_keys: Iterable[str] = ()
                 ) -> None:
        self._entries = [(_digest(k.encode()), Principal(t)) for k, t in keys]
        self._entries += [(_digest(k.encode()), Principal(None, admin=True))
                          for k in admin_keys]
        self.required = bool(self._entries)

    @classmethod
    def of(cls, auth: AuthConfig) -> KeyRing:
        """The client and admin keys `auth` configures."""
        return cls(((k.key, k.tenant) for k in auth.client_keys()), auth.admin_keys)

    def principal(self, authorization: bytes | None, x_api_key: bytes | None = None
                  ) -> Principal | None:
        """Who the request's key names (the Authorization header's value, else x-api-key's);
        None for a missing or wrong key. Without configured keys, every request is the
        default tenant's."""
        if not self.required:
            return OPEN
        if authorization is not None and authorization.startswith(b"Bearer "):
            found = self._lookup(authorization[7:])
            if found is not None:
                return found
        return None if x_api_key is None else self._lookup(x_api_key)

    def _lookup(self, key: bytes) -> Principal | None:
        sent = _digest(key)
        found: Principal | None = None
        for digest, who in self._entries:
            if hmac.compare_digest(digest, sent) and found is None:
                found = who
        return found

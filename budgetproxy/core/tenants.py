"""Tenants: each client key's episodes live in its tenant's namespace, so the same id under
two tenants names two episodes, and no tenant can reach (or learn of) another's."""

from __future__ import annotations

from budgetproxy.core.ids import is_valid_episode_id
from budgetproxy.core.keys import Principal

# The header an admin key names a tenant's namespace with (ignored from other keys).
TENANT_HEADER = b"x-episode-tenant"


def tenant_for(who: Principal, requested: bytes | None) -> str | None:
    """The namespace a request acts in: its key's tenant, or for an admin key the tenant
    it names in X-Episode-Tenant (none named: the default namespace).
    Raises ValueError for a tenant name no key could have (the charset of episode ids)."""
    if not who.admin:
        return who.tenant
    if not requested:
        return None
    name = requested.decode("latin-1")
    if not is_valid_episode_id(name) or len(name) > 64:
        raise ValueError("X-Episode-Tenant must be 1-64 characters of A-Z a-z 0-9 . _ : -")
    return name


def qualified(tenant: str | None, episode_id: str) -> str:
    """The id the store and the trajectory log know an episode by: `tenant/id`, or the id
    itself in the default namespace. Neither ids nor tenant names hold a "/"."""
    return episode_id if tenant is None else f"{tenant}/{episode_id}"


def local_id(stored_id: str) -> str:
    """The id a client named, from the id the store knows (the inverse of `qualified`)."""
    return stored_id.rpartition("/")[2]


def tenant_of(stored_id: str) -> str | None:
    tenant, slash, _ = stored_id.rpartition("/")
    return tenant if slash else None

"""Per-episode bearer keys: minted by the episode API, read on model calls (core/rollout_ids)."""

from __future__ import annotations

from budgetproxy.core.rollout_ids import KEY_PREFIX, key_episode, mint_key
from budgetproxy.errors import invalid_api_key

_BEARER = b"Bearer " + KEY_PREFIX.encode()


class EpisodeKeys:
    """Keys that name one episode each, signed with this proxy's secret (rollouts.key_secret:
    replicas share it; without one each process draws its own, so only it knows its keys)."""

    def __init__(self, secret: bytes) -> None:
        self.secret = secret

    def mint(self, episode_id: str) -> str:
        return mint_key(self.secret, episode_id)

    @staticmethod
    def carries(authorization: bytes | None) -> bool:
        return authorization is not None and authorization.startswith(_BEARER)

    def episode_of(self, authorization: bytes | None) -> str | None:
        """The episode an `Authorization: Bearer bpk....` header names; None for any other
        header. A key of that form whose signature is wrong is a 401, not a key to pass on."""
        if not self.carries(authorization):
            return None
        assert authorization is not None
        eid = key_episode(self.secret, authorization[len(b"Bearer "):].decode("latin-1"))
        if eid is None:
            raise invalid_api_key()
        return eid

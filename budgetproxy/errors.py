"""Errors the proxy itself returns: OpenAI-shaped {"error": {message, type, param, code}}, or
Anthropic-shaped {"type": "error", "error": {type, message}} on the Messages API."""

from __future__ import annotations

import orjson

from budgetproxy.core.ids import is_valid_episode_id

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_error",
}

# Anthropic's error types by status (its API reference, "Errors"); others are api_error.
_ANTHROPIC_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


class ProxyError(Exception):
    """An error answered by the proxy itself. 4xx carry `x-should-retry: false`."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.type = type_ or _TYPE_BY_STATUS.get(status, "api_error")
        self.headers = headers or {}

    def body(self) -> bytes:
        return orjson.dumps(
            {
                "error": {
                    "message": self.message,
                    "type": self.type,
                    "param": self.param,
                    "code": self.code,
                }
            }
        )

    def anthropic_body(self) -> bytes:
        """The error in the Messages API's shape; the message names the proxy's code."""
        return orjson.dumps(
            {
                "type": "error",
                "error": {
                    "type": _ANTHROPIC_TYPE_BY_STATUS.get(self.status, "api_error"),
                    "message": f"{self.message} ({self.code})",
                },
            }
        )

    def header_list(self) -> list[tuple[bytes, bytes]]:
        out = [(b"content-type", b"application/json")]
        if 400 <= self.status < 500:
            out.append((b"x-should-retry", b"false"))
        out.extend((k.lower().encode(), v.encode()) for k, v in self.headers.items())
        return out


def request_too_large(limit: int) -> ProxyError:
    return ProxyError(413, "request_too_large", f"Request body exceeds the limit of {limit} "
                      "bytes (server.max_body_bytes)")


def invalid_api_key() -> ProxyError:
    return ProxyError(401, "invalid_api_key", "Missing or invalid API key for this proxy")


def invalid_request(message: str, param: str | None = None) -> ProxyError:
    return ProxyError(400, "invalid_request", message, param=param)


def invalid_episode_id(
    message: str = "Episode ids are 1-128 characters of A-Z a-z 0-9 . _ : -, other than . and ..",
) -> ProxyError:
    return ProxyError(400, "invalid_episode_id", message, param="episode_id")


def checked_episode_id(episode_id: str) -> str:
    """The id itself, or `invalid_episode_id` when it is not 1-128 of A-Z a-z 0-9 . _ : -
    (`.` and `..` excepted)."""
    if not is_valid_episode_id(episode_id):
        raise invalid_episode_id()
    return episode_id


def budget_exhausted(episode_id: str, budget: int, status: int = 403) -> ProxyError:
    return ProxyError(
        status,
        "turn_budget_exhausted",
        f"Episode {episode_id!r} has used its turn budget of {budget}; no further model calls "
        "are forwarded. Report the outcome or start a new episode.",
        type_="budget_exhausted",
    )


def episode_finished(episode_id: str, status: int = 403, final_replies: int | None = None
                     ) -> ProxyError:
    """A call on a finished episode, or (`final_replies`) on an exhausted one that has had
    all its final replies in finish mode."""
    if final_replies is not None:
        return ProxyError(
            status, "episode_finished",
            f"Episode {episode_id!r} has used its budget and had its final "
            f"{'reply' if final_replies == 1 else f'{final_replies} replies'}; model calls "
            "on it are refused. Report the outcome or start a new episode.")
    return ProxyError(
        status,
        "episode_finished",
        f"Episode {episode_id!r} has finished; model calls on it are refused.",
    )


def upstream_redirect(upstream: str, status: int) -> ProxyError:
    """An upstream answered a redirect: never followed (it could resend the body, and the
    credentials, to another origin), and not worth a client's retry."""
    return ProxyError(502, "upstream_redirect",
                      f"Upstream {upstream!r} answered a redirect ({status}), which the proxy "
                      "does not follow", headers={"x-should-retry": "false"})

"""The OpenAPI description of the proxy's own API: every status a route answers, each error
with the OpenAI-shaped error schema, and the episode id's pattern."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from budgetproxy.config import NAME_PATTERN as EXPERIMENT_NAME_PATTERN
from budgetproxy.core.spec import GROUP_MAX_CHARS, TASK_ID_MAX_CHARS
from budgetproxy.serve.episode_bodies import (
    EPISODE_ID_PATTERN,
    JSON_VALUE_SCHEMA,
    TAG_VALUE_SCHEMA,
)

# A path segment the proxy routes (core.paths): printable ASCII less "/" "\\" "%" ";", and
# not "." or ".." (which the path resolves away): a character that is not a dot, or 3+ dots.
_SEG = r"[\x20-\x24\x26-\x2e\x30-\x3a\x3c-\x5b\x5d-\x7e]"
SEGMENT_PATTERN = (rf"^({_SEG}*[\x20-\x24\x26-\x2d\x30-\x3a\x3c-\x5b\x5d-\x7e]{_SEG}*"
                   r"|\.{3,})$")
_SEGMENT_MAX = {"task_id": TASK_ID_MAX_CHARS, "group": GROUP_MAX_CHARS}

_ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"type": "string"},
            "param": {"type": ["string", "null"]},
            "code": {"type": "string"},
        },
    }},
}
_WHEN = {
    400: "Malformed JSON, a missing, wrong-typed or out-of-bounds field, or a bad episode id "
         "(`invalid_request`, `invalid_episode_id`, `invalid_path`)",
    401: "`auth` keys are configured and the key is missing or wrong (`invalid_api_key`)",
    404: "No episode with this id in the caller's tenant (`episode_not_found`)",
    409: "The episode exists (`episode_exists`), or it ended with a different outcome "
         "(`outcome_conflict`)",
    413: "The body is larger than `server.max_body_bytes` (`request_too_large`)",
    502: "No upstream answered (`upstream_unreachable`)",
    503: "The episode store is unavailable (`store_unavailable`)",
}
_GROUPS = "/v1/groups/{task_id}/{group}"
_TRAJECTORY = "/v1/episodes/{episode_id}/trajectory"
_EXPERIMENT = "/v1/experiments/{name}"
# What each route of the API can answer besides its success.
_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/episodes"): (400, 401, 409, 413, 503),
    ("get", "/v1/episodes/{episode_id}"): (400, 401, 404, 503),
    ("post", "/v1/episodes/{episode_id}/outcome"): (400, 401, 404, 409, 413, 503),
    ("post", "/v1/episodes/{episode_id}/end"): (400, 401, 404, 503),
    ("get", _TRAJECTORY): (400, 401, 404, 409, 503),
    ("post", "/v1/groups"): (400, 401, 409, 413, 503),
    ("get", _GROUPS): (400, 401, 404, 503),
    ("get", "/v1/models"): (401, 502),
    ("get", _EXPERIMENT): (400, 401, 404, 503),
}
# Where a route's error means something else than _WHEN says.
_WHEN_HERE: dict[tuple[str, str, int], str] = {
    ("get", _TRAJECTORY, 404): "No episode with this id in the caller's tenant "
        "(`episode_not_found`), or its turns are not kept: it is past retention, or "
        "`rollouts.keep_turns` is false (`trajectory_not_found`)",
    ("get", _TRAJECTORY, 409): "The episode has not ended (`episode_active`)",
    ("post", "/v1/episodes/{episode_id}/outcome", 409): "The episode ended with a different "
        "outcome (`outcome_conflict`), or it ended and was forgotten: only its id is left, "
        "and the report can no longer be recorded (`episode_forgotten`)",
    ("post", "/v1/groups", 400): "Malformed JSON, or a missing, wrong-typed or out-of-bounds "
        "field (`invalid_request`)",
    ("post", "/v1/groups", 409): "The group was declared with another size (`group_conflict`)",
    ("post", "/v1/groups", 503): "The group store is unavailable (`store_unavailable`)",
    ("get", _GROUPS, 400): "`wait` is not a boolean, `timeout_s` is not a number from 0 "
        "to 600 (`invalid_request`), or the path holds what no path segment may "
        "(`invalid_path`)",
    ("get", _GROUPS, 404): "No group with this task id and name in the caller's tenant "
        "(`group_not_found`)",
    ("get", _GROUPS, 503): "The group or episode store is unavailable (`store_unavailable`)",
    ("get", _EXPERIMENT, 400): "The path holds what no path segment may (`invalid_path`)",
    ("get", _EXPERIMENT, 404): "No experiment of this name in the config "
        "(`experiment_not_found`)",
    ("get", _EXPERIMENT, 503): "The experiment store is unavailable (`store_unavailable`)",
}

def describe(app: FastAPI) -> dict[str, Any]:
    """The app's OpenAPI document, with the proxy's error answers in place of FastAPI's
    422 (which this API never answers: its validation errors are 400s)."""
    spec = get_openapi(title=app.title, version=app.version, summary=app.summary,
                       routes=app.routes)
    schemas = spec.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = _ERROR
    schemas["JsonValue"] = JSON_VALUE_SCHEMA
    schemas["TagValue"] = TAG_VALUE_SCHEMA
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            responses.pop("422", None)
            for status in _ERRORS.get((method, path), ()):
                responses[str(status)] = {
                    "description": _WHEN_HERE.get((method, path, status), _WHEN[status]),
                    "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Error"}}},
                }
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body is not None and "anyOf" in body["schema"]:
                # An optional body is one that may be left out, not a JSON null (a
                # non-object body is a 400): only the object form is described.
                (ref,) = [s for s in body["schema"]["anyOf"] if s.get("type") != "null"]
                body["schema"] = ref
                op["requestBody"]["required"] = False
            for param in op.get("parameters", ()):
                if param.get("in") != "path":
                    continue
                if param["name"] == "episode_id":
                    param["schema"] = {"type": "string", "pattern": EPISODE_ID_PATTERN}
                elif param["name"] == "name" and path == _EXPERIMENT:
                    param["schema"] = {"type": "string", "pattern": EXPERIMENT_NAME_PATTERN}
                elif param["name"] in _SEGMENT_MAX:  # a group's names, as a path carries them
                    param["schema"] = {"type": "string", "pattern": SEGMENT_PATTERN,
                                       "maxLength": _SEGMENT_MAX[param["name"]]}
    return spec


def install(app: FastAPI) -> None:
    """Serve `describe(app)` (built once, on first request) at the app's openapi_url."""
    cached: dict[str, Any] = {}

    def openapi() -> dict[str, Any]:
        if not cached:
            cached.update(describe(app))
        return cached

    app.openapi = openapi  # type: ignore[method-assign]

"""core.paths: generated spellings of a route all mean that route; whatever a client sends
is refused or made canonical, and a canonical path has nothing left to normalise."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from yarl import URL

from budgetproxy.core.paths import PathRefused, canonical_path, wire_path, wire_query

ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages",
          "/episodes/ep-1/v1/chat/completions", "/v1/models/some-model"]


@st.composite
def spelled_char(draw: st.DrawFn, c: str) -> str:
    """A character as itself or percent-encoded, in either letter case of the hex."""
    if not draw(st.booleans()):
        return c
    code = f"%{ord(c):02x}"
    return code.upper() if draw(st.booleans()) else code


_DOT = st.sampled_from([".", "%2e", "%2E"])
_DOTDOT = st.sampled_from(["..", "%2e%2e", ".%2e", "%2E.", "%2E%2e"])


@st.composite
def spelling(draw: st.DrawFn, route: str) -> str:
    """`route` with its characters maybe encoded, and '.', 'x/..' and empty segments mixed in
    between its segments, and maybe a trailing slash."""
    out: list[str] = []
    for seg in route.strip("/").split("/"):
        for _ in range(draw(st.integers(0, 2))):
            noise = draw(st.sampled_from(["dot", "up", "empty"]))
            if noise == "dot":
                out.append(draw(_DOT))
            elif noise == "up":
                word = draw(st.text("abcxyz-", min_size=1, max_size=4))
                out.extend([word, draw(_DOTDOT)])
            else:
                out.append("")
        out.append("".join(draw(spelled_char(c)) for c in seg))
    trailing = "/" if draw(st.booleans()) else ""
    return "/" + "/".join(out) + trailing


@pytest.mark.parametrize("route", ROUTES)
@given(data=st.data())
def test_every_spelling_of_a_route_is_that_route(route: str, data: st.DataObject) -> None:
    assert canonical_path(data.draw(spelling(route))) == route


_PIECES = st.sampled_from([*"/.%\\;aAz09-_~:@ 2eEfF5c", "%2f", "%2e", "%00", "\x00", "é"])
_PATH_TEXT = st.lists(_PIECES, max_size=30).map(lambda p: "/" + "".join(p))


@given(_PATH_TEXT)
@example("/v1/..%2fadmin")
@example("/v1/%2e%2e/%2e%2e/admin")
def test_any_path_is_refused_or_canonical(raw: str) -> None:
    try:
        canon = canonical_path(raw)
    except PathRefused as e:
        assert e.reason and e.segment >= 0
        return
    assert canon.startswith("/")
    segments = canon.split("/")[1:]
    if canon != "/":
        assert all(s not in ("", ".", "..") for s in segments), canon
    assert not any(c in canon for c in "\\%;")
    assert canonical_path(wire_path(canon)) == canon  # its own canonical form


@given(_PATH_TEXT)
def test_a_client_library_has_nothing_left_to_normalise(raw: str) -> None:
    """Built into an upstream URL under a base path, a canonical path survives yarl's own
    normalisation unchanged and stays under the base path."""
    try:
        canon = canonical_path(raw)
    except PathRefused:
        return
    sent = "/api/v1" + wire_path(canon)
    normalised = URL("http://upstream:8000" + sent)  # what a client would make of it
    assert normalised.raw_path == sent
    assert normalised.raw_path.startswith("/api/v1")
    assert URL("http://upstream:8000" + sent, encoded=True).raw_path == sent


@pytest.mark.parametrize(("raw", "reason"), [
    ("/v1/..%2fadmin", "encoded"), ("/v1/a%5cb", "encoded"), ("/v1/a\\b", "hold"),
    ("/../v1", "above the root"), ("/v1/%zz", "hex"), ("/v1/a%2", "hex"),
    ("/v1/a%00b", "hold"), ("/v1/%25", "'%'"), ("/v1/a;b=c", "';'"), ("v1/chat", "start"),
    ("/v1/caf\u00e9", "'é'"),
])
def test_what_has_no_single_meaning_is_refused(raw: str, reason: str) -> None:
    with pytest.raises(PathRefused, match=reason):
        canonical_path(raw)


def test_the_usual_path_is_returned_as_is() -> None:
    path = "/v1/chat/completions"
    assert canonical_path(path) is path


def test_a_query_keeps_its_bytes_and_escapes_only_what_a_request_line_cannot_carry() -> None:
    assert wire_query(b"api-version=2024-10-21&x=a%20b") == "api-version=2024-10-21&x=a%20b"
    assert wire_query(b"x=a b&y=\xff") == "x=a%20b&y=%FF"

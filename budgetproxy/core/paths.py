"""Request paths: the one canonical spelling of a request target, decided before routing."""

from __future__ import annotations

from urllib.parse import quote

# Bytes a canonical path segment may hold once decoded: printable ASCII, less the separators
# a server or client library could read differently ("/" "\\"), the escape character itself
# (a segment holding "%" would be decoded twice by a lenient upstream) and ";" (path
# parameters, which some servers strip before routing).
_REFUSED_IN_SEGMENT = frozenset("/\\%;")
# What a segment keeps unescaped on the wire: RFC 3986 unreserved and sub-delims, ":" and "@".
_SAFE_ON_WIRE = "!$&'()*+,=:@"
# Characters whose presence sends a path down the slow, decoding route.
_NEEDS_WORK = ("%", "\\", "/.", "//", ";")


class PathRefused(ValueError):
    """A request target with no one meaning: answered 400 before any routing."""

    def __init__(self, reason: str, segment: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.segment = segment  # index of the offending segment (0 = the first after "/")


def canonical_path(raw: str) -> str:
    """The canonical form of a raw (still percent-encoded) request path.

    Every percent escape is decoded, empty segments and a trailing slash are dropped, and
    "." and ".." segments (also spelled %2e) are resolved. Raises PathRefused for what has no
    single meaning: encoded slashes (%2f, %5c), backslashes, decoded "%" or ";", control or
    non-ASCII characters, bad escapes, and ".." above the root. The result starts with "/",
    holds no dot or empty segment, and is its own canonical form once encoded (wire_path).
    """
    if not raw.startswith("/"):
        raise PathRefused("a request path must start with '/'", 0)
    if not any(c in raw for c in _NEEDS_WORK) and (raw == "/" or not raw.endswith("/")):
        if raw.isascii() and raw.isprintable():
            return raw  # the common case: nothing to decode or resolve
    out: list[str] = []
    for i, seg in enumerate(raw[1:].split("/")):
        text = _decoded(seg, i)
        if text in ("", "."):
            continue
        if text == "..":
            if not out:
                raise PathRefused("'..' climbs above the root of the path", i)
            out.pop()
            continue
        out.append(text)
    return "/" + "/".join(out)


def _decoded(seg: str, index: int) -> str:
    if "%" in seg:
        parts = seg.split("%")
        chars = [parts[0]]
        for part in parts[1:]:
            code = part[:2]
            if len(code) < 2 or not all(c in "0123456789abcdefABCDEF" for c in code):
                raise PathRefused("a '%' in the path is not followed by two hex digits", index)
            chars.append(chr(int(code, 16)))
            chars.append(part[2:])
        text = "".join(chars)
        # what the escapes decode to is judged below like what was sent as is, with one
        # more rule: an escape must not spell a separator the raw path would have split on
        if "/" in text or "\\" in text:
            raise PathRefused("an encoded '/' or '\\' in the path has no single meaning", index)
    else:
        text = seg
    for c in text:
        if c in _REFUSED_IN_SEGMENT or not (" " <= c <= "~"):
            raise PathRefused(f"the path may not hold {c!r}", index)
    return text


def wire_path(canonical: str) -> str:
    """A canonical path percent-encoded for a request line: it decodes back to itself, and
    an upstream (or a client library) has nothing left in it to normalise."""
    return "/".join(quote(seg, safe=_SAFE_ON_WIRE) for seg in canonical.split("/"))


def wire_query(raw: bytes) -> str:
    """A raw query string as the client sent it, with any byte a request line cannot carry
    as is (controls, spaces, non-ASCII, '#') percent-encoded; everything else untouched."""
    if raw.isascii() and all(0x21 <= b <= 0x7E and b != 0x23 for b in raw):
        return raw.decode("ascii")
    return quote(raw, safe="!$&'()*+,;=:@/?%")

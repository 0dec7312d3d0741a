"""Serving the episode view's folder on 127.0.0.1 (the standard library's HTTP server)."""

from __future__ import annotations

import functools
import http.server
import sys
from pathlib import Path


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base's name
        return


def make_server(folder: Path, port: int = 0) -> http.server.ThreadingHTTPServer:
    """A server of `folder`'s files bound to 127.0.0.1 only (the pages hold prompts and replies:
    nothing to offer other hosts)."""
    handler = functools.partial(_Quiet, directory=str(folder))
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve_folder(folder: Path, port: int, first: str) -> int:
    """Serve until interrupted; prints the URL of the first page."""
    server = make_server(folder, port)
    host, bound = server.server_address[:2]
    print(f"budgetproxy view: serving on http://{host!s}:{bound}/{first} (Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    print("budgetproxy view: stopped", file=sys.stderr)
    return 0

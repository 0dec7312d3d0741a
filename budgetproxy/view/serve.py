"""Serving the episode view's pages on 127.0.0.1 (the standard library's HTTP server)."""

from __future__ import annotations

import http.server
import re
import signal
import sys
from pathlib import Path
from types import FrameType

_PAGE = re.compile(r"/([A-Za-z0-9_.-]+\.html)")


def _handler(folder: Path, first: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Pages(http.server.BaseHTTPRequestHandler):
        """GET of a page of the folder (a flat name ending .html); "/" leads to the first
        page; anything else, other files of the folder included, is 404."""

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            path = self.path.split("?", 1)[0].split("#", 1)[0]
            if path == "/":
                self.send_response(302)
                self.send_header("Location", "/" + first)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            m = _PAGE.fullmatch(path)
            page = folder / m.group(1) if m else None
            if page is None or not page.is_file():
                self.send_error(404, "no such page")
                return
            body = page.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            return

    return Pages


def make_server(folder: Path, port: int = 0, first: str = "index.html"
                ) -> http.server.ThreadingHTTPServer:
    """A server of `folder`'s pages bound to 127.0.0.1 only (the pages hold prompts and replies:
    nothing to offer other hosts)."""
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), _handler(folder, first))


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def serve_folder(folder: Path, port: int, first: str) -> int:
    """Serve until SIGINT (Ctrl-C) or SIGTERM; prints the URL of the first page. Both are
    handled here, as `budgetproxy serve` handles them: a process started in the background
    by a shell inherits SIGINT ignored, and would otherwise not stop on it."""
    server = make_server(folder, port, first)
    host, bound = server.server_address[:2]
    previous = {s: signal.signal(s, _stop) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"budgetproxy view: serving on http://{host!s}:{bound}/{first} (Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.server_close()
    print("budgetproxy view: stopped", file=sys.stderr)
    return 0

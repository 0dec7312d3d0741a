"""Progress of long DuckDB reads on stderr: a live percentage on a TTY, sparse lines otherwise."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

# Below these input sizes a read is quick enough that progress would only flicker.
TTY_MIN_BYTES = 64 * 1024 * 1024
PIPE_MIN_BYTES = 1024 * 1024 * 1024


class Progress:
    """Runs statements on a DuckDB connection and reports their progress while they run."""

    def __init__(self, total_bytes: int, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        tty = self.stream.isatty()
        self.tty = tty
        self.enabled = total_bytes >= (TTY_MIN_BYTES if tty else PIPE_MIN_BYTES)

    def execute(self, con: Any, sql: str, label: str) -> Any:
        """con.execute(sql), showing `label: NN%` on the stream while it runs."""
        if not self.enabled:
            return con.execute(sql)
        done = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(con, label, done), daemon=True)
        watcher.start()
        try:
            return con.execute(sql)
        finally:
            done.set()
            watcher.join()

    def _watch(self, con: Any, label: str, done: threading.Event) -> None:
        started = time.monotonic()
        shown = -1.0
        while not done.wait(0.25 if self.tty else 2.0):
            try:
                pct = float(con.query_progress())
            except Exception:  # progress is cosmetic; never let it break a read
                return
            if pct < 0:
                continue
            elapsed = time.monotonic() - started
            if self.tty:
                self.stream.write(f"\r{label}: {pct:5.1f}%  {elapsed:5.1f} s")
                self.stream.flush()
                shown = pct
            elif pct - shown >= 10:
                self.stream.write(f"{label}: {pct:.0f}% after {elapsed:.0f} s\n")
                self.stream.flush()
                shown = pct
        if self.tty and shown >= 0:
            self.stream.write("\r\033[K")
            self.stream.flush()

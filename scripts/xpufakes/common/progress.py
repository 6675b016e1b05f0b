"""How a download shows its progress, on stderr (stdout stays the verb's
result, e.g. `fetch --path`'s paths).

On a terminal, one live line per file, redrawn in place: its name, the
bytes so far of the total, the rate, and `[k/N]` when several files are
fetched; it ends with what was verified. Off a terminal (CI logs, `docker
build`), one line when a file starts and one when it is verified. A file
already in the cache shows nothing (the caller does not start one).
"""

import sys
import time

REDRAW = 0.1  # seconds between two redraws of the live line


def size(count: float) -> str:
    """Bytes in decimal units, as pip shows them: 912 kB, 45.6 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{int(count)} B"


class Download:
    """The progress of one file. `step` is "k/N" when it is one of several."""

    def __init__(self, name: str, total: int | None, step: str = "", stream=None):
        self.name = name
        self.total = total
        self.prefix = f"[{step}] " if step else ""
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.done = 0
        self.started = time.monotonic()
        self.drawn = 0.0
        if self.live:
            self._draw()
        else:
            of = f" ({size(total)})" if total else ""
            self._say(f"{self.prefix}downloading {name}{of}\n")

    def _so_far(self) -> str:
        done = size(self.done)
        return f"{done} of {size(self.total)}" if self.total else done

    def _rate(self) -> str:
        elapsed = time.monotonic() - self.started
        return f"{size(self.done / elapsed)}/s" if self.done and elapsed else ""

    def _draw(self, end: str = "") -> None:
        line = f"{self.prefix}{self.name}  {self._so_far()}  {self._rate()}"
        self._say(f"\r{line.rstrip()}\x1b[K{end}")
        self.drawn = time.monotonic()

    def _say(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def advance(self, count: int) -> None:
        self.done += count
        if self.live and time.monotonic() - self.drawn >= REDRAW:
            self._draw()

    def verified(self, what: str) -> None:
        """The file is complete and checked (`what`: how)."""
        seconds = time.monotonic() - self.started
        summary = f"{size(self.done)} in {seconds:.1f} s, {what}"
        if self.live:
            self._say(f"\r{self.prefix}{self.name}  {summary}\x1b[K\n")
        else:
            self._say(f"{self.prefix}{self.name}: {summary}\n")

    def failed(self) -> None:
        """End the live line, so that the error is a line of its own."""
        if self.live:
            self._draw("\n")

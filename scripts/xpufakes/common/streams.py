"""stdout and stderr whose reader may go away (`| head`, `| true`): output
to a closed pipe is dropped and the verb goes on, so the exit status always
says what was done to the tree, never that a pipe closed."""

import contextlib
import os
import sys


class Lossy:
    """A stream that drops what its reader no longer reads."""

    def __init__(self, stream):
        self._stream = stream
        self.lost = False

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lose()

    def _lose(self) -> None:
        self.lost = True
        # the interpreter flushes stdout at exit: point it at /dev/null
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())
        os.close(devnull)

    def __getattr__(self, name):
        return getattr(self._stream, name)


@contextlib.contextmanager
def lossy():
    """sys.stdout and sys.stderr made Lossy for the duration."""
    stdout, stderr = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Lossy(stdout), Lossy(stderr)
    try:
        yield
    finally:
        sys.stdout.flush()  # what is buffered for a reader that left is dropped
        sys.stderr.flush()
        sys.stdout, sys.stderr = stdout, stderr

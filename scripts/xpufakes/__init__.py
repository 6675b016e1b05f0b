"""The patch tool of the XPU GEMM fakes project (`python -m xpufakes`)."""

import _signal  # built in: importing it takes no time (`signal` imports enum)
import os
import sys


def _stopped_while_starting(signum, frame):
    os.write(2, b"error: interrupted; nothing changed\n")
    os._exit(128 + signum)


# `python -m xpufakes ...`: a Ctrl-C while the tool is still loading (its
# imports take a few tenths of a second) stops it with one line, not a
# KeyboardInterrupt traceback; __main__ gives SIGINT back to Python once the
# tool is loaded. A SIGINT held back (blocked) by whatever started this
# process is let through now, to this handler. Imported as a library (the
# tests, `-m xpufakes.proof.prove`), nothing changes.
_argv = sys.orig_argv
if "-m" in _argv and _argv[_argv.index("-m") + 1 :][:1] == ["xpufakes"]:
    _signal.signal(_signal.SIGINT, _stopped_while_starting)
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, [_signal.SIGINT])

"""One run at a time on a tree: an flock on the tree's vllm/ package
directory itself, so no lock file ever appears in the tree (nothing for git,
pip's RECORD or a later revert to see). apply, revert and stage take it
exclusively, check and status shared, from before they inspect the tree until
they exit. A run that finds it taken says so and waits (up to LOCK_WAIT
seconds); a held signal stops the wait."""

import contextlib
import fcntl
import os
import sys
import time
from pathlib import Path

from xpufakes.common import transaction
from xpufakes.common.errors import Refusal

LOCK_WAIT = float(os.environ.get("VLLM_XPU_FAKES_LOCK_WAIT", "600"))


@contextlib.contextmanager
def tree_lock(root: Path, exclusive: bool = True):
    target = root / "vllm"
    try:
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        raise Refusal(f"{target}: cannot open to lock it ({e.strerror})") from None
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        if not _try(fd, mode):
            print(
                f"waiting for another xpufakes run on {root} to finish",
                file=sys.stderr,
                flush=True,
            )
            deadline = time.monotonic() + LOCK_WAIT
            with transaction.held_signals() as pending:
                while not _try(fd, mode):
                    if pending:
                        raise transaction.Interrupted(pending[0])
                    if time.monotonic() > deadline:
                        raise Refusal(
                            f"another xpufakes run has held {target} for "
                            f"{LOCK_WAIT:.0f} s; nothing changed"
                        )
                    time.sleep(0.02)
        yield
    finally:
        os.close(fd)


def _try(fd: int, mode: int) -> bool:
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True

"""Run a child process so that a held signal stops it.

While signals are held (transaction.held_signals, as `stage` does), a signal
that arrives while a child runs (a check, the validation, git) stops the
child's whole process group and raises transaction.Interrupted, so the
caller cleans up at once instead of after the child's minute of work.
Without held signals this is subprocess.run.
"""

import contextlib
import os
import signal
import subprocess

from xpufakes.common import transaction

POLL = 0.05  # seconds between looks at the held signals


def run(
    command: list[str],
    *,
    input: str | None = None,
    check: bool = False,
    **kwargs,
) -> subprocess.CompletedProcess:
    """subprocess.run(command, input=..., check=..., **kwargs) (capture_output,
    text, cwd, env, ...)."""
    pending = transaction.held()
    if pending is None:
        return subprocess.run(command, input=input, check=check, **kwargs)
    if kwargs.pop("capture_output", False):
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    # its own process group: stopped as a whole, with what it started
    with subprocess.Popen(command, start_new_session=True, **kwargs) as child:
        while True:
            if pending:
                _stop(child)
                raise transaction.Interrupted(pending[0])
            try:
                out, err = child.communicate(input, timeout=POLL)
                break
            except subprocess.TimeoutExpired:
                input = None  # sent already
    done = subprocess.CompletedProcess(command, child.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def _stop(child: subprocess.Popen) -> None:
    for signum, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, None)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue

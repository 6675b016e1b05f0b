# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""How the plugin's line reaches the user: from every vLLM process, once
for each call of say(), in vLLM's format wherever vLLM sets up its logging.

vLLM loads its general plugins in every process it starts. Whether its
logging is set up by then depends on the release and the process:

* vLLM up to 0.27 sets it up when ``vllm.logger`` is first imported
  (``import vllm`` does): before any plugin runs, in every process.
* vLLM 0.32 sets it up with explicit calls (``vllm.logger.configure_logging``).
  The engine core and each worker make that call before they load the
  plugins, but the front end makes it after: ``vllm serve`` builds its
  argument parser, which loads the plugins, and then sets up logging (as do
  ``python -m vllm.entrypoints.openai.api_server`` and ``LLM(...)``). A line
  logged in between has no handler: Python drops INFO.

So say(line) does one of three things:

1. A handler would take the line now (vLLM's, or the application's), or vLLM
   is told not to set up logging (``VLLM_CONFIGURE_LOGGING=0``, or the
   configuration vLLM last applied says so): the line goes to the logger
   ``vllm.vllm_xpu_fakes`` now, under vLLM's logger, so vLLM's handler,
   format and level (``VLLM_LOGGING_LEVEL``, ``--log-level``) apply; with
   ``VLLM_CONFIGURE_LOGGING=0`` whatever the application set up decides, as
   for vLLM's own lines.
2. Otherwise the line is kept, with the time and place it was said, and
   logged the first time a log record is made in this process once a
   handler exists: that is vLLM's first line after it sets up its logging,
   so the kept line comes out just before it, through vLLM's handler, in
   vLLM's format. (A log-record factory, chained in front of the current
   one, as vLLM chains its own; it takes itself out once nothing is kept,
   unless another factory was chained in front of it, and then only
   passes records on.)
3. At exit, or when flush() is called, a line still kept (nothing set up
   logging in this process: ``python -c "import vllm; ...;
   load_general_plugins()"`` on vLLM 0.32) is written to
   ``VLLM_LOGGING_STREAM`` (stdout unless it names stderr), in vLLM 0.32's
   text layout, if its level is at least ``VLLM_LOGGING_LEVEL`` (INFO
   unless set).

Each call's line comes out once: the one that writes a kept line takes it
off the list first, and a process forked while a line is kept forgets it
(the line is its parent's). Standard library only; never raises.
"""

import atexit
import logging
import os
import sys
import threading
import time

LOGGER = "vllm.vllm_xpu_fakes"
logger = logging.getLogger(LOGGER)

# The text layout of vLLM 0.32 (vllm/logger.py _FORMAT, _DATE_FORMAT), for a
# line nothing set up a handler for by the end of the process.
FALLBACK_FORMAT = (
    "{prefix}(%(processName)s pid=%(process)d) %(levelname)s %(asctime)s "
    "[%(filename)s:%(lineno)d] %(message)s"
)
FALLBACK_DATE_FORMAT = "%m-%d %H:%M:%S"

# Lines said before any handler existed: (level, line, (file, line, function),
# time said).
_kept: list[tuple[int, str, tuple[str, int, str], float]] = []
_lock = threading.Lock()
_factory: list = []  # our record factory, while it is installed


def say(line: str, warning: bool = False) -> None:
    """Log `line` (one line, the whole of it: nothing is %-formatted) at INFO,
    or WARNING if `warning`, from this process, once (see the module's
    docstring)."""
    try:
        level = logging.WARNING if warning else logging.INFO
        caller = sys._getframe(1)
        where = (caller.f_code.co_filename, caller.f_lineno, caller.f_code.co_name)
        del caller
        if logger.hasHandlers() or not _vllm_sets_up_logging():
            _log(level, line, where, None)
            return
        with _lock:
            _kept.append((level, line, where, time.time()))
            _hook()
    except Exception:  # noqa: BLE001 - a line is never worth vLLM's start-up
        pass


def _vllm_sets_up_logging() -> bool:
    """Whether vLLM will set up logging in this process: not with
    VLLM_CONFIGURE_LOGGING=0 (read as vLLM reads it: an integer), nor once
    the configuration vLLM applied says configure_logging false (vLLM 0.32's
    --logging-config)."""
    try:
        if int(os.environ.get("VLLM_CONFIGURE_LOGGING", "1")) == 0:
            return False
    except ValueError:
        pass  # vLLM itself refuses such a value
    applied = getattr(
        sys.modules.get("vllm.logger"), "_last_configured_logging_config", None
    )
    return getattr(applied, "configure_logging", True) is not False


def _log(level: int, line: str, where: tuple, said: float | None) -> None:
    """The line as a record of our logger, made by the record factory in
    place (vLLM 0.32 adds its process name there), from the place it was
    said, at the time it was said."""
    if not logger.isEnabledFor(level):
        return
    path, lineno, function = where
    record = logger.makeRecord(LOGGER, level, path, lineno, line, (), None, function)
    if said is not None:
        record.created = said
        record.msecs = int((said - int(said)) * 1000) + 0.0
        record.relativeCreated = (said - logging._startTime) * 1000
    logger.handle(record)


def _take() -> list:
    with _lock:
        taken = list(_kept)
        _kept.clear()
    return taken


def _flush() -> None:
    for level, line, where, said in _take():
        _log(level, line, where, said)


class _FlushFirst:
    """A log-record factory: makes each record with the factory it was
    chained in front of; the first time a handler exists when a record is
    made, logs the kept lines first."""

    def __init__(self, wrapped) -> None:
        self.wrapped = wrapped

    def __call__(self, *args, **kwargs):
        record = self.wrapped(*args, **kwargs)
        if _kept and logger.hasHandlers():
            try:
                _flush()  # our records: made with _kept empty, no recursion
                _unhook()
            except Exception:  # noqa: BLE001 - never break vLLM's logging
                pass
        return record


def _hook() -> None:
    """(with _lock held) Our factory in front of the current one, once."""
    if not _factory:
        factory = _FlushFirst(logging.getLogRecordFactory())
        logging.setLogRecordFactory(factory)
        _factory.append(factory)


def _unhook() -> None:
    with _lock:
        if _kept or not _factory:
            return
        factory = _factory.pop()
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(factory.wrapped)


def flush() -> None:
    """The lines still kept, now: to a handler if one exists, else written
    as vLLM 0.32 would have, if vLLM's level lets them through. Run at exit;
    a process that knows nothing will set up logging (the self-check, after
    vLLM's load_general_plugins()) calls it to have them in order."""
    try:
        taken = _take()
        if not taken:
            return
        if logger.hasHandlers() or not _vllm_sets_up_logging():
            for level, line, where, said in taken:
                _log(level, line, where, said)
            return
        threshold = logging.getLevelName(
            os.environ.get("VLLM_LOGGING_LEVEL", "INFO").strip().upper()
        )
        if not isinstance(threshold, int):
            threshold = logging.INFO
        stream = os.environ.get("VLLM_LOGGING_STREAM", "ext://sys.stdout")
        out = sys.stderr if stream == "ext://sys.stderr" else sys.stdout
        formatter = logging.Formatter(
            FALLBACK_FORMAT.format(prefix=os.environ.get("VLLM_LOGGING_PREFIX", "")),
            FALLBACK_DATE_FORMAT,
        )
        for level, line, where, said in taken:
            if level < threshold:
                continue
            path, lineno, function = where
            record = logging.LogRecord(
                LOGGER, level, path, lineno, line, (), None, function
            )
            record.created = said
            record.msecs = int((said - int(said)) * 1000) + 0.0
            out.write(formatter.format(record) + "\n")
        out.flush()
    except Exception:  # noqa: BLE001 - at exit, nothing more to do
        pass


def _forget() -> None:
    """In a forked child: the kept lines are the parent's."""
    global _lock
    _lock = threading.Lock()
    _kept.clear()


atexit.register(flush)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget)

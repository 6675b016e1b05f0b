"""How a verb's outcome becomes the exit status and the last line: a
refusal, a tree left as it was, a change committed, a signal that arrived
before or after the commit (errors.py has the statuses)."""

import signal
import sys
from collections.abc import Callable
from contextlib import nullcontext

from xpufakes.common import errors, transaction
from xpufakes.common.errors import NotAffected, Refusal
from xpufakes.verbs.pipeline import Committed


def run(verb: Callable[[], object], holding_signals: bool) -> int:
    """Run a verb; its exit status. A verb returns its exit status, or what
    it committed (pipeline.Committed, or None: nothing). Verbs that change a
    tree hold signals from start to exit (see transaction)."""
    holding = transaction.held_signals() if holding_signals else nullcontext([])
    try:
        with holding as pending:
            try:
                outcome = verb()
            except Refusal as e:
                if pending and e.status != errors.STRANDED:
                    # the signal stopped it (e.g. the proof's subprocess got
                    # the same Ctrl-C), and nothing was changed
                    raise transaction.Interrupted(pending[0]) from None
                raise
            committed = outcome if isinstance(outcome, Committed) else None
            sys.stdout.flush()
            if pending:
                name = signal.Signals(pending[0]).name
                if committed:
                    print(
                        f"{committed.done}; interrupted by {name} after "
                        f"{committed.leaves}",
                        file=sys.stderr,
                    )
                    return errors.INTERRUPTED_AFTER_COMMIT
                print(f"error: interrupted by {name}; nothing changed", file=sys.stderr)
                return 128 + pending[0]
            return outcome if isinstance(outcome, int) else errors.OK
    except Refusal as e:
        print(f"error: {e}", file=sys.stderr)
        return e.status
    except NotAffected as e:
        print(e)
        return errors.OK
    except transaction.Interrupted as e:
        print(f"error: {e}; nothing changed (every file is as it was)", file=sys.stderr)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("error: interrupted; nothing changed", file=sys.stderr)
        return errors.INTERRUPTED

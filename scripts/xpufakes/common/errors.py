"""The tool's exit statuses and the exception for a refusal."""

OK = 0
REFUSED = 1  # bad input or a tree we will not touch; a one-line reason
USAGE = 2  # wrong command line
# the change was made completely, then a held signal arrived: the tree is in
# the new state (the message says which)
INTERRUPTED_AFTER_COMMIT = 3
# a change failed and could not be undone completely: the message lists each
# file's state and the command that finishes the job
STRANDED = 4
NOT_HERE = 77  # cannot run on this machine (e.g. no Intel GPU), not a failure
INTERRUPTED = 130


class Refusal(Exception):
    """Stop with a one-line reason and a non-zero exit; nothing was changed."""

    def __init__(self, message: str, status: int = REFUSED):
        super().__init__(message)
        self.status = status


class NotAffected(Exception):
    """Nothing to do, and that is success (exit 0): the tree does not need
    the fix. The message is the one line that says why."""

import signal
import sys

from xpufakes.cli import main

signal.signal(signal.SIGINT, signal.default_int_handler)  # see __init__
status = main()
# The verb is done and has said so: a Ctrl-C from here on changes nothing,
# and must not kill the interpreter while it exits (Python gives SIGINT its
# default action back before the process ends: exit -2, the tool's last line
# and status lost).
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
sys.exit(status)

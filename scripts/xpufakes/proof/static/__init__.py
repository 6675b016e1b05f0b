"""The static audit: the tree's Python read as text (no import, no torch).
scan.py: every call of an XPU op (or of a helper that wraps one) and the
context it is in; reach.py: every call on the traced path that Dynamo
cannot trace, with a chain of calls."""

"""The proof and the audit: the static scan, the calls Dynamo cannot trace,
the stand-ins, loading a tree's fakes, the opcheck grid, the whole-model
trace (MODEL=), the proof before a commit.
"""

"""Taking the fix upstream: the upstream and in-place cuts, the in-tree tests,
the PR texts, the tree's own checks, `make stage`.
"""

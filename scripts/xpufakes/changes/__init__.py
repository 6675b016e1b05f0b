"""Changing a tree: the recipes, the series and their diffs, what a series does
to a tree and which base it has, the recipe path on live files, the lock,
and the series written from the recipes (refresh, export).
"""

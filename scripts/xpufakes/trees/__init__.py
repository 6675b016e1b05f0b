"""A vLLM tree: where it is and which release (pins, the official sdists and
wheels, an installed wheel's RECORD), its native modules and its Python
parsed.
"""

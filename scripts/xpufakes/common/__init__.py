"""Plain helpers every part uses: exit statuses, where the data lives, output
streams, child processes, changing files all or nothing, the ops this
project gives fakes to.
"""

"""The verbs: plan -> prove -> commit -> report, one module per verb, and how
an outcome becomes an exit status.
"""

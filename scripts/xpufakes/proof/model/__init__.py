"""The whole-model proof (`make audit MODEL=...`): a model of
data/models.toml built from a vLLM tree's own model module at a tiny size
and traced as vLLM compiles it, on the XPU platform's code paths, in a fresh
Python with torch (cli.py; its docstring says what runs and what is stood
in).

In layers (tests/test_layering.py): the catalog (models.py) and the
transformers release it is built with (transformers_pin.py), the results
in words (report.py, no torch), the trees' features (features.py); the run
from the tool (runner.py) and the limits (limits.py); the XPU environment of
the proof's Python (environment.py) and the model built in it (build.py);
the trace of one configuration (trace.py); the command line (cli.py).
"""

"""Run a verb of this tool in a fresh Python process (fake registrations and
imported vLLM trees are process-global), its result passed back as JSON in a
file: vLLM's logging may write to stdout."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from xpufakes.common import paths


def env(**extra: str) -> dict[str, str]:
    """The environment for a child Python that imports this tool."""
    return dict(
        os.environ,
        PYTHONPATH=str(paths.REPO / "scripts"),
        PYTHONDONTWRITEBYTECODE="1",
        **extra,
    )


def run_verb(args: list[str], out_option: str, **extra: str):
    """(completed process, the JSON the verb wrote to `out_option FILE`, or
    None if it wrote none)."""
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "result.json"
        done = subprocess.run(
            [sys.executable, "-m", "xpufakes", *args, out_option, str(out)],
            capture_output=True,
            text=True,
            env=env(**extra),
        )
        return done, json.loads(out.read_text()) if out.is_file() else None

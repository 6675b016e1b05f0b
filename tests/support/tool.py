"""Run the tool the way a user does: `python -m xpufakes <verb> ...`."""

import os
import subprocess
import sys
from pathlib import Path

from xpufakes.common import paths

SCRIPTS = Path(paths.REPO) / "scripts"


def run(*args: str, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "xpufakes", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=600,
        **kwargs,
    )


def start(*args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = dict(os.environ, PYTHONPATH=str(SCRIPTS))
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "xpufakes", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=full_env,
    )


def git_env(name: str) -> dict:
    """The environment for git commands in a test repository, as `name`."""
    email = f"{name}@example.invalid"
    return dict(
        os.environ,
        GIT_AUTHOR_NAME=name,
        GIT_AUTHOR_EMAIL=email,
        GIT_COMMITTER_NAME=name,
        GIT_COMMITTER_EMAIL=email,
    )


def refused(result: subprocess.CompletedProcess, *words: str, status: int = 1) -> str:
    """The tool's refusal: exit `status`, one `error:` line on stderr holding
    every one of `words`; that line."""
    assert result.returncode == status, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]

"""Downloads show their progress: on a terminal (a pty here) a live line per
file with its name, bytes of the total, the rate and `[k/N]` for several;
off a terminal one line when a file starts and one when it is verified;
nothing for a release already in the cache. The package index is a local
HTTP server on loopback serving small sdists made here, pinned in a fixture
pins.toml (VLLM_XPU_FAKES_PATCHES), slowly enough to be seen."""

import hashlib
import http.server
import io
import os
import pty
import random
import re
import subprocess
import sys
import tarfile
import threading
import time

import pytest

from support import tool

SIZE = 1_500_000  # bytes of incompressible content per sdist
CHUNK, PAUSE = 1 << 16, 0.02  # the server sends 64 kB every 20 ms


def _sdist(version: str) -> bytes:
    data = random.Random(version).randbytes(SIZE)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as archive:
        for name, content in (("PKG-INFO", version.encode()), ("payload", data)):
            info = tarfile.TarInfo(f"vllm-{version}/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return out.getvalue()


class _Index(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}

    def do_GET(self):  # noqa: N802 - the handler's name
        if self.path.rstrip("/") == "/simple/vllm":
            links = "".join(f'<a href="/files/{n}">{n}</a>\n' for n in self.files)
            self._send(f"<html><body>\n{links}</body></html>\n".encode(), "text/html")
            return
        name = self.path.rsplit("/", 1)[-1]
        if name not in self.files:
            self.send_error(404)
            return
        self._send(self.files[name], "application/octet-stream", slow=True)

    def _send(self, body: bytes, kind: str, slow: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        for start in range(0, len(body), CHUNK):
            self.wfile.write(body[start : start + CHUNK])
            if slow:
                time.sleep(PAUSE)

    def log_message(self, *args):
        pass


@pytest.fixture
def index(tmp_path):
    """(environment for the tool, cache directory): three releases pinned,
    9.0.0 and 9.0.1 to download, 9.0.2 already in the cache; 9.0.3 pinned
    with a sha256 its sdist does not have."""
    sdists = {v: _sdist(v) for v in ("9.0.0", "9.0.1", "9.0.2", "9.0.3")}
    pinned = {v: hashlib.sha256(d).hexdigest() for v, d in sdists.items()}
    pinned["9.0.3"] = "0" * 64
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "pins.toml").write_text(
        "".join(
            f'[releases."{v}"]\nsdist_sha256 = "{sha}"\nseries = "fixture"\n'
            'kernels = ""\nfiles = {}\n\n'
            for v, sha in pinned.items()
            if v != "9.0.3"
        )
    )
    _Index.files = {f"vllm-{v}.tar.gz": d for v, d in sdists.items()}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache = tmp_path / "cache"
    cached = cache / "trees" / "9.0.2"
    cached.mkdir(parents=True)
    (cached / ".xpufakes-sdist-sha256").write_text(pinned["9.0.2"] + "\n")
    env = {
        "PIP_INDEX_URL": f"http://127.0.0.1:{server.server_port}/simple/",
        "VLLM_XPU_FAKES_CACHE": str(cache),
        "VLLM_XPU_FAKES_PATCHES": str(patches),
        "no_proxy": "127.0.0.1",
        "NO_PROXY": "127.0.0.1",
    }
    yield env, cache, patches, pinned
    server.shutdown()
    server.server_close()


VERIFIED = r"1\.5 MB in \d+\.\d s, sha256 verified"


def test_progress_off_a_terminal(index):
    env, cache, _, _ = index
    result = tool.run("fetch", "--all", "--path", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        str(cache / "trees" / v) for v in ("9.0.0", "9.0.1", "9.0.2")
    ]
    lines = result.stderr.splitlines()
    assert len(lines) == 4, result.stderr  # nothing for 9.0.2, in the cache
    for k, version in enumerate(("9.0.0", "9.0.1")):
        name = f"vllm-{version}.tar.gz"
        assert lines[2 * k] == f"[{k + 1}/2] downloading {name} (1.5 MB)"
        assert re.fullmatch(
            rf"\[{k + 1}/2\] {re.escape(name)}: {VERIFIED}", lines[2 * k + 1]
        ), lines[2 * k + 1]
    again = tool.run("fetch", "--all", env=env)
    assert again.returncode == 0 and again.stderr == ""  # all in the cache

    (cache / "trees" / "9.0.0" / ".xpufakes-sdist-sha256").unlink()
    (cache / "sdists" / "vllm-9.0.0.tar.gz").unlink()
    one = tool.run("fetch", "9.0.0", env=env)
    assert one.stderr.splitlines()[0] == "downloading vllm-9.0.0.tar.gz (1.5 MB)"


def _on_a_terminal(env: dict, *args: str) -> tuple[int, str]:
    """(status, what the tool wrote to its stderr, a pty)."""
    leader, follower = pty.openpty()
    run = subprocess.Popen(
        [sys.executable, "-m", "xpufakes", *args],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env=dict(os.environ, PYTHONPATH=str(tool.SCRIPTS), **env),
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            data = os.read(leader, 4096)
        except OSError:  # the pty is closed: the tool has exited
            break
        if not data:
            break
        seen += data
    os.close(leader)
    return run.wait(timeout=120), seen.decode().replace("\r\n", "\n")


def test_progress_on_a_terminal(index):
    env, _, patches, pinned = index
    status, seen = _on_a_terminal(env, "fetch", "--all")
    assert status == 0, seen
    # each file's line is redrawn in place (\r ... erase to the end) while
    # it downloads, then ends with what was verified
    for k, version in enumerate(("9.0.0", "9.0.1")):
        name = re.escape(f"[{k + 1}/2] vllm-{version}.tar.gz")
        live = re.findall(
            rf"\r{name}  (\d+\.\d) (kB|MB) of 1\.5 MB  \d+\.\d [kM]B/s\x1b\[K", seen
        )
        assert any(unit == "kB" or float(n) < 1.5 for n, unit in live), seen
        assert re.search(rf"\r{name}  {VERIFIED}\x1b\[K\n", seen), seen
    assert "9.0.2" not in seen  # in the cache: nothing
    assert "downloading" not in seen

    # a download that fails ends its live line before the error
    with open(patches / "pins.toml", "a") as f:
        f.write(
            '[releases."9.0.3"]\nsdist_sha256 = "' + pinned["9.0.3"] + '"\n'
            'series = "fixture"\nkernels = ""\nfiles = {}\n'
        )
    status, seen = _on_a_terminal(env, "fetch", "9.0.3")
    assert status == 1
    assert re.search(
        r"vllm-9\.0\.3\.tar\.gz  [^\n]*\n"
        r"error: vllm-9\.0\.3\.tar\.gz has sha256 [0-9a-f]{64}, pinned 0{64}; "
        r"discarded\n$",
        seen,
    ), seen

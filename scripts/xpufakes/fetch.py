"""Download a pinned release's official sdist, check it, unpack it to the cache.

The package index is pip's: PIP_INDEX_URL, else the index-url of pip's
configuration, else pip's default. The sdist must match the sha256 pinned in
patches/pins.toml; a download that does not is discarded. A download shows
its progress on stderr (progress.py); a release already in the cache is
silent.
"""

import hashlib
import json
import os
import re
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

from . import paths, progress
from .errors import Refusal
from .pins import Pin

_MARKER = ".xpufakes-sdist-sha256"


def index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if url:
        return url
    config = _pip_config()
    for key in (":env:.index-url", "install.index-url", "global.index-url"):
        if key in config:
            return config[key]
    return _pip_default_index()


def _pip_default_index() -> str:
    """pip's built-in default index, asked of pip in a separate process
    (importing pip's internals here can upset setuptools' distutils shim)."""
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    for python in (sys.executable, "python3"):
        try:
            out = subprocess.run(
                [python, "-c", code], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    raise Refusal("cannot tell the package index: set PIP_INDEX_URL")


def _pip_config() -> dict[str, str]:
    try:
        out = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    config = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip().strip("'\"")
    return config


def _ssl_context() -> ssl.SSLContext:
    cafile = os.environ.get("PIP_CERT") or _pip_config().get("global.cert")
    return ssl.create_default_context(cafile=cafile if cafile else None)


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links: dict[str, str] = {}

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                name = urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1])
                self.links[name] = href


def sdist_url(version: str) -> str:
    """The sdist's download address, from the index's project page."""
    page = urllib.parse.urljoin(index_url().rstrip("/") + "/", "vllm/")
    request = urllib.request.Request(
        page,
        headers={
            "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1",
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=120, context=_ssl_context()) as r:
            body = r.read().decode("utf-8", errors="replace")
            content_type = r.headers.get("Content-Type", "")
    except OSError as e:
        raise Refusal(f"cannot read the package index at {page}: {e}") from None
    filename = f"vllm-{version}.tar.gz"
    if "json" in content_type:
        files = {f["filename"]: f["url"] for f in json.loads(body).get("files", [])}
    else:
        parser = _Links()
        parser.feed(body)
        files = parser.links
    if filename not in files:
        raise Refusal(f"the package index at {page} has no {filename}")
    return urllib.parse.urljoin(page, files[filename])


def sdist_path(pin: Pin) -> Path:
    return paths.cache_dir() / "sdists" / f"vllm-{pin.version}.tar.gz"


def tree_path(pin: Pin) -> Path:
    return paths.cache_dir() / "trees" / pin.version


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(pin: Pin, step: str = "") -> Path:
    """The verified sdist in the cache (downloaded if not there yet, its
    progress shown; `step`: "k/N" of several)."""
    target = sdist_path(pin)
    if target.is_file() and _sha256_of(target) == pin.sdist_sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url = sdist_url(pin.version)
    name = f"vllm-{pin.version}.tar.gz"
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
    shown = None
    try:
        with (
            os.fdopen(fd, "wb") as out,
            urllib.request.urlopen(url, timeout=600, context=_ssl_context()) as r,
        ):
            length = r.headers.get("Content-Length", "")
            shown = progress.Download(
                name, int(length) if length.isdigit() else None, step
            )
            while block := r.read(1 << 16):
                out.write(block)
                shown.advance(len(block))
        actual = _sha256_of(Path(tmp))
        if actual != pin.sdist_sha256:
            raise Refusal(
                f"{name} has sha256 {actual}, pinned {pin.sdist_sha256}; discarded"
            )
        os.replace(tmp, target)
        shown.verified("sha256 verified")
        shown = None
    except OSError as e:
        raise Refusal(f"cannot download {name}: {e}") from None
    finally:
        if shown is not None:
            shown.failed()
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def cached(pin: Pin) -> bool:
    """Whether the release is unpacked and verified in the cache."""
    marker = tree_path(pin) / _MARKER
    return marker.is_file() and marker.read_text().strip() == pin.sdist_sha256


def fetch_all(chosen: list[Pin]) -> Iterator[tuple[Pin, Path]]:
    """fetch() each release, in turn; when there are several, the downloads
    are numbered "k/N" (N: how many are not in the cache yet)."""
    missing = [pin.version for pin in chosen if not cached(pin)]
    for pin in chosen:
        step = ""
        if len(chosen) > 1 and pin.version in missing:
            step = f"{missing.index(pin.version) + 1}/{len(missing)}"
        yield pin, fetch(pin, step)


def fetch(pin: Pin, step: str = "") -> Path:
    """The unpacked, verified release in the cache."""
    tree = tree_path(pin)
    if cached(pin):
        return tree
    sdist = download(pin, step)
    tree.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=tree.parent, prefix=f".{pin.version}-"))
    try:
        with tarfile.open(sdist) as archive:
            kwargs = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            archive.extractall(staging, **kwargs)
        (top,) = [p for p in staging.iterdir() if re.match(r"vllm-", p.name)]
        (top / _MARKER).write_text(pin.sdist_sha256 + "\n")
        if tree.exists():
            shutil.rmtree(tree)
        os.replace(top, tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree

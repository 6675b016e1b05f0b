"""The package index: pip's (PIP_INDEX_URL, else the index-url of pip's
configuration, else pip's default), its project page (the files it lists,
with the sha256 it gives for each), and reading a file it serves, whole or
a byte range of it (HTTP range requests; a file:// index is read in place).
"""

import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from xpufakes.common import progress
from xpufakes.common.errors import Refusal


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


def ssl_context() -> ssl.SSLContext:
    cafile = os.environ.get("PIP_CERT") or _pip_config().get("global.cert")
    return ssl.create_default_context(cafile=cafile if cafile else None)


@dataclass(frozen=True)
class File:
    """A file the index lists for a project."""

    name: str
    url: str  # absolute
    sha256: str | None  # as the index gives it (None: it gives none)


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


def project_page(project: str) -> str:
    return urllib.parse.urljoin(index_url().rstrip("/") + "/", f"{project}/")


def project_files(project: str) -> dict[str, File]:
    """Every file the index lists for `project`, by file name (PEP 691 JSON,
    else the PEP 503 HTML page with `#sha256=` in each link)."""
    page = project_page(project)
    request = urllib.request.Request(
        page,
        headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120, context=ssl_context()) as r:
            body = r.read().decode("utf-8", errors="replace")
            content_type = r.headers.get("Content-Type", "") or ""
    except OSError as e:
        raise Refusal(f"cannot read the package index at {page}: {e}") from None
    found = {}
    if "json" in content_type:
        for f in json.loads(body).get("files", []):
            url = urllib.parse.urljoin(page, f["url"])
            sha = (f.get("hashes") or {}).get("sha256")
            found[f["filename"]] = File(f["filename"], url, sha)
        return found
    parser = _Links()
    parser.feed(body)
    for name, href in parser.links.items():
        match = re.search(r"#sha256=([0-9a-f]{64})", href)
        url = urllib.parse.urljoin(page, href.split("#")[0])
        found[name] = File(name, url, match.group(1) if match else None)
    return found


def listed(project: str, filename: str) -> File:
    """The file `filename` of `project` on the index, or a refusal."""
    files = project_files(project)
    if filename not in files:
        raise Refusal(f"the package index at {project_page(project)} has no {filename}")
    return files[filename]


def open_url(url: str, start: int | None = None, end: int | None = None):
    """The response for `url` (the bytes start..end, inclusive, if given;
    start < 0: the last -start bytes). A server that ignores the range
    answers with status 200 and the whole file: the caller checks."""
    headers = {}
    if start is not None and start < 0:
        headers["Range"] = f"bytes={start}"
    elif start is not None:
        headers["Range"] = f"bytes={start}-{'' if end is None else end}"
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=600, context=ssl_context())


def download(url: str, name: str, sha256: str, into: Path, step: str = "") -> Path:
    """The file at `url` (http(s) or file:), verified against `sha256`, as
    `into`/`name`; its progress shown (`step`: "k/N" of several)."""
    into.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=into, prefix=f".{name}.", suffix=".part")
    shown = None
    try:
        with os.fdopen(fd, "wb") as out:
            parsed = urllib.parse.urlparse(url)
            if parsed.scheme == "file":
                response = open(urllib.parse.unquote(parsed.path), "rb")  # noqa: SIM115
                length = str(os.fstat(response.fileno()).st_size)
            else:
                response = open_url(url)
                length = response.headers.get("Content-Length", "")
            with response as r:
                shown = progress.Download(
                    name, int(length) if length.isdigit() else None, step
                )
                digest = hashlib.sha256()
                while block := r.read(1 << 16):
                    out.write(block)
                    digest.update(block)
                    shown.advance(len(block))
        if digest.hexdigest() != sha256:
            raise Refusal(
                f"{name} has sha256 {digest.hexdigest()}, pinned {sha256}; discarded"
            )
        target = into / name
        os.replace(tmp, target)
        shown.verified("sha256 verified")
        shown = None
        return target
    except OSError as e:
        raise Refusal(f"cannot download {name}: {e}") from None
    finally:
        if shown is not None:
            shown.failed()
        if os.path.exists(tmp):
            os.unlink(tmp)

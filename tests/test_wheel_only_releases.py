"""Releases published only as wheels (vLLM 0.15.0 and 0.15.1, ~509 MB for
x86_64, nearly all native extensions): their pristine tree is the wheel as it
installs (vllm/ and its .dist-info) without the native extensions, read by
HTTP range requests and verified file by file against the wheel's RECORD,
whose sha256 is pinned (scripts/xpufakes/trees/wheel.py).

The reading: a local HTTP server on loopback serves small wheels made here,
pinned in a fixture pins.toml; it counts the bytes it sends. With range
requests only the members but the native one are read; a server that
ignores them gets the whole wheel downloaded and checked against its pinned
sha256. Negative controls: a member that is not RECORD's, a RECORD that is
not the pinned one, a whole wheel that is not the pinned one: each refused
in one line, nothing left in the cache.

The real thing: the pinned 0.15.1's tree is what its RECORD says (every
file but the native extensions, each with RECORD's sha256), and installed
as it is -- vllm/ and vllm-0.15.1.dist-info/ -- it applies on the series
path, audits clean (unpatched, it fails the audit: torch_ipex::fp8_gemm_w8a16
has no fake), and reverts byte for byte (its RECORD too)."""

import base64
import csv
import hashlib
import http.server
import io
import random
import re
import threading
import zipfile

import pytest

from support import releases, tool
from xpufakes.trees import pins

VERSION = "9.1.0"
NATIVE = "vllm/_C.abi3.so"


def _digest(data: bytes) -> str:
    raw = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _wheel(files: dict[str, bytes], tamper: dict[str, bytes] | None = None) -> bytes:
    """A wheel of `files` with its RECORD (written before `tamper` replaces
    some members' bytes)."""
    files = dict(files)
    info = f"vllm-{VERSION}.dist-info"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for name, data in files.items():
        writer.writerow([name, _digest(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    files[f"{info}/RECORD"] = record.getvalue().encode()
    files.update(tamper or {})
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()


def _members() -> dict[str, bytes]:
    native = random.Random(1).randbytes(3_000_000)  # incompressible, "large"
    return {
        "vllm/__init__.py": b"",
        "vllm/_version.py": f'__version__ = version = "{VERSION}"\n'.encode(),
        NATIVE: native,
        "vllm/_ipex_ops.py": b"import intel_extension_for_pytorch as ipex\n",
        "vllm/model_executor/x.py": b"x = 1\n" * 1000,
        f"vllm-{VERSION}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}\n"
        ).encode(),
    }


class _Index(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    ranges = True
    sent = 0

    def do_GET(self):  # noqa: N802 - the handler's name
        if self.path.rstrip("/") == "/simple/vllm":
            links = "".join(f'<a href="/files/{n}">{n}</a>\n' for n in self.files)
            self._send(200, f"<html><body>\n{links}</body></html>\n".encode(), {})
            return
        name = self.path.rsplit("/", 1)[-1]
        if name not in self.files:
            self.send_error(404)
            return
        body = self.files[name]
        wanted = re.fullmatch(r"bytes=(-?\d+)-?(\d*)", self.headers.get("Range", ""))
        if not (self.ranges and wanted):
            self._send(200, body, {})
            return
        first, last = int(wanted.group(1)), wanted.group(2)
        start = len(body) + first if first < 0 else first
        end = int(last) if last else len(body) - 1
        self._send(
            206,
            body[start : end + 1],
            {"Content-Range": f"bytes {start}-{end}/{len(body)}"},
        )

    def _send(self, status: int, body: bytes, headers: dict) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(body)
        type(self).sent += len(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def index(tmp_path):
    """(run the tool's fetch, the good wheel, the pins.toml): the release
    pinned by the good wheel's sha256 and its RECORD's."""
    good = _wheel(_members())
    with zipfile.ZipFile(io.BytesIO(good)) as z:
        record = z.read(f"vllm-{VERSION}.dist-info/RECORD")
    name = f"vllm-{VERSION}-cp38-abi3-manylinux_2_31_x86_64.whl"
    patches = tmp_path / "patches"
    patches.mkdir()
    pinned = patches / "pins.toml"
    pinned.write_text(
        f'[releases."{VERSION}"]\nwheel = "{name}"\n'
        f'wheel_sha256 = "{hashlib.sha256(good).hexdigest()}"\n'
        f'record_sha256 = "{hashlib.sha256(record).hexdigest()}"\n'
        'series = "fixture"\nkernels = ""\nfiles = {}\n'
    )
    _Index.files = {name: good}
    _Index.ranges = True
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cache = tmp_path / "cache"
    env = {
        "PIP_INDEX_URL": f"http://127.0.0.1:{server.server_port}/simple/",
        "VLLM_XPU_FAKES_CACHE": str(cache),
        "VLLM_XPU_FAKES_PATCHES": str(patches),
        "no_proxy": "127.0.0.1",
        "NO_PROXY": "127.0.0.1",
    }

    def fetch():
        _Index.sent = 0
        return tool.run("fetch", "--path", VERSION, env=env)

    yield fetch, cache, name
    server.shutdown()
    server.server_close()


def _tree_is_the_wheel_but_native(cache) -> None:
    tree = cache / "trees" / VERSION
    for rel, data in _members().items():
        if rel == NATIVE:
            assert not (tree / rel).exists()
        else:
            assert (tree / rel).read_bytes() == data, rel
    assert (tree / f"vllm-{VERSION}.dist-info" / "RECORD").is_file()


def test_only_the_members_are_read_and_verified(index):
    fetch, cache, name = index
    result = fetch()
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(cache / "trees" / VERSION)
    assert _Index.sent < 100_000  # of a 3 MB wheel: not its native member
    assert re.search(
        rf"{re.escape(name)}, all but its native extensions: .* 6 files, sha256 "
        "verified against its RECORD",
        result.stderr,
    ), result.stderr
    _tree_is_the_wheel_but_native(cache)
    again = fetch()  # in the cache: nothing read, nothing said
    assert again.returncode == 0 and again.stderr == "" and _Index.sent == 0


def test_without_range_requests_the_whole_wheel_is_checked(index):
    fetch, cache, name = index
    _Index.ranges = False
    result = fetch()
    assert result.returncode == 0, result.stderr
    assert _Index.sent > 3_000_000
    assert f"{name}: 3.0 MB in" in result.stderr and "sha256 verified" in result.stderr
    _tree_is_the_wheel_but_native(cache)
    assert not any((cache / "wheels").iterdir())  # the whole wheel is not kept


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        ({"vllm/_ipex_ops.py": b"import os\n"}, "vllm/_ipex_ops.py is not the file"),
        (
            {f"vllm-{VERSION}.dist-info/RECORD": b"vllm/__init__.py,,\n"},
            "its RECORD has sha256",
        ),
    ],
)
def test_a_member_that_is_not_the_pinned_one_is_refused(index, tamper, said):
    fetch, cache, name = index
    _Index.files = {name: _wheel(_members(), tamper)}
    result = fetch()
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith(f"error: {name}: ")
    assert said in result.stderr and "discarded" in result.stderr
    assert not (cache / "trees" / VERSION).exists()
    assert not any(p.name.startswith(".") for p in (cache / "trees").iterdir())


def test_a_whole_wheel_that_is_not_the_pinned_one_is_refused(index):
    fetch, cache, name = index
    _Index.ranges = False
    _Index.files = {name: _wheel(_members(), {"vllm/model_executor/x.py": b"x = 2\n"})}
    result = fetch()
    assert result.returncode == 1
    assert re.search(
        rf"error: {re.escape(name)} has sha256 [0-9a-f]{{64}}, pinned ", result.stderr
    )
    assert not (cache / "trees" / VERSION).exists()
    assert not any((cache / "wheels").iterdir())


# ---------------------------------------------------------------------------
# The pinned 0.15.1, installed
# ---------------------------------------------------------------------------

RELEASE = "0.15.1"


def test_the_pristine_tree_is_what_its_record_says():
    tree = releases.pristine(RELEASE)
    record = tree / f"vllm-{RELEASE}.dist-info" / "RECORD"
    pin = pins.load().get(RELEASE)
    assert hashlib.sha256(record.read_bytes()).hexdigest() == pin.record_sha256
    absent = []
    rows = list(csv.reader(record.read_text().splitlines()))
    for path, digest, _ in rows:
        if path.endswith("/RECORD"):
            continue
        if not (tree / path).is_file():
            absent.append(path)
            continue
        assert _digest((tree / path).read_bytes()) == digest, path
    assert absent and all(p.endswith(".abi3.so") for p in absent), absent
    files = {
        p.relative_to(tree).as_posix()
        for p in tree.rglob("*")
        if p.is_file() and not p.name.startswith(".xpufakes-")
    }
    assert files == {path for path, _, _ in rows} - set(absent)


def test_an_installed_release_applies_audits_clean_and_reverts(tmp_path):
    site = releases.copy_of(RELEASE, tmp_path / "site-packages")
    pristine = releases.file_hashes(site)
    unpatched = tool.run("audit", str(site))  # the negative control
    assert unpatched.returncode == 1, unpatched.stdout + unpatched.stderr
    failing = [x for x in unpatched.stdout.splitlines() if x.startswith("FAIL: ")]
    assert unpatched.stdout.splitlines()[-1].startswith("FAIL: ")
    assert any(
        "traced op(s)" in x and "torch_ipex::fp8_gemm_w8a16" in x for x in failing
    )

    result = tool.run("apply", str(site))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == (
        f"vLLM {RELEASE} (vllm/_version.py), installed package at {site} "
        "-> series ipex-0.15.0"
    )
    assert (site / "vllm" / "_xpu_gemm_fakes.py").is_file()
    record = (site / f"vllm-{RELEASE}.dist-info" / "RECORD").read_text()
    assert "vllm/_xpu_gemm_fakes.py,sha256=" in record
    assert "state: patched" in tool.run("status", str(site)).stdout

    audited = tool.run("audit", str(site))
    assert audited.returncode == 0, audited.stdout + audited.stderr
    assert audited.stdout.splitlines()[-1].startswith("OK: every traced")

    result = tool.run("revert", str(site))
    assert result.returncode == 0, result.stdout + result.stderr
    assert releases.file_hashes(site) == pristine


def test_a_damaged_member_or_a_file_that_is_no_zip_is_refused(tmp_path):
    """zipfile reads the members from the fetched spans and checks each
    one's CRC: a member whose bytes changed after the zip was written is
    refused, naming it; a file that is no zip says so. The same wheel
    undamaged reads whole (the control)."""
    from xpufakes.trees import wheel

    files = {"vllm/__init__.py": b"x = 1\n" * 50, "vllm/a.py": b"y = 2\n" * 50}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    good = tmp_path / "good.whl"
    good.write_bytes(out.getvalue())
    source = wheel.Local(good)
    members = wheel.directory(source, "good.whl")
    assert wheel.read(source, "good.whl", members, lambda n: None) == files
    damaged = tmp_path / "damaged.whl"
    damaged.write_bytes(out.getvalue().replace(b"y = 2\n", b"y = 3\n", 1))
    source = wheel.Local(damaged)
    members = wheel.directory(source, "damaged.whl")
    with pytest.raises(wheel.BadZip, match=r"damaged.whl: vllm/a.py: Bad CRC-32"):
        wheel.read(source, "damaged.whl", members, lambda n: None)
    junk = tmp_path / "junk.whl"
    junk.write_bytes(b"not a zip" * 100)
    with pytest.raises(wheel.BadZip, match=r"junk.whl: not a zip file"):
        wheel.directory(wheel.Local(junk), "junk.whl")

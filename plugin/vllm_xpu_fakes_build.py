"""The build backend of the vllm-xpu-fakes plugin (PEP 517), standard library
only: `pip install ./plugin` and `make plugin` build the same wheel, offline.

The package is this directory's `vllm_xpu_fakes/` plus the overlay's modules
(`../vllm_overlay/vllm/<module>.py`, the files the series adds to vLLM),
shipped as they are except for the one import that names the package they
live in (`from vllm._xpu_gemm_fakes import` becomes `from
vllm_xpu_fakes._xpu_gemm_fakes import`): one source for both ways in.
`tests/test_plugin.py` checks that the two cannot differ. The same for the
opcheck grid of the self-check (`python -m vllm_xpu_fakes --verify`): the
overlay's tests/kernels/quantization/xpu_gemm_reference.py, the grid of the
in-tree tests and `make verify-xpu`, shipped as it is
(`tests/test_plugin_selfcheck.py` checks).

The .dist-info carries the repository's LICENSE (`licenses/LICENSE`,
`License-File: LICENSE`, core metadata 2.4), and METADATA's description is
the plugin's page, `docs/plugin.md`, made to read on a package index: a
link to a relative path (nothing on an index resolves it) becomes its text
followed by the repository path it names, in parentheses; an anchor in the
page becomes its text; an absolute link is kept; a reference-style link to
a relative path is refused (write it inline). A closing line says which
repository's paths those are. pyproject.toml lists `readme` in `dynamic`.

An sdist carries the shipped copies, LICENSE and the description
(README.md) in its root, and its PKG-INFO; a wheel built from it (the
directory has a PKG-INFO) takes them from there, so it is the same wheel.

The wheel and the sdist are reproducible: fixed timestamps and modes, files
in order.
"""

import base64
import gzip
import hashlib
import io
import os
import posixpath
import re
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Built from an unpacked sdist (which has a PKG-INFO), or from the checkout
# (plugin/, the repository around it).
FROM_SDIST = (HERE / "PKG-INFO").is_file()
REPO = HERE.parent
OVERLAY = REPO / "vllm_overlay" / "vllm"
# The overlay's modules the plugin ships, and the import each may contain
# that names the vLLM package they are installed in.
SHIPPED = ("_xpu_gemm_fakes.py", "_ipex_woq_linear.py", "_xpu_opaque_calls.py")
# The overlay's test modules the plugin ships as they are: the opcheck grid
# (its name in the package -> the file).
GRID = REPO / "vllm_overlay" / "tests" / "kernels" / "quantization"
SHIPPED_AS_IS = {"xpu_gemm_reference.py": GRID / "xpu_gemm_reference.py"}
OVERLAY_IMPORT = "from vllm._xpu_gemm_fakes import "
DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip file can say
LICENSE = "LICENSE"  # the repository's; .dist-info/licenses/LICENSE
PAGE = "docs/plugin.md"  # the description's source, in the repository
README = "README.md"  # the description, as an sdist carries it
DESCRIPTION_TYPE = "text/markdown"
CLOSING = (
    f"\n---\n\nThis page is `{PAGE}` of the vllm-xpu-fakes repository;"
    " the paths and `make` targets it names are the repository's.\n"
)


def _sections() -> dict[str, dict[str, str]]:
    """pyproject.toml as {section: {key: value}}: the subset of TOML it
    uses (`key = "string"` lines under section headers), so that a Python
    without tomllib (3.10) builds the plugin too."""
    section, found = "", {}
    for line in (HERE / "pyproject.toml").read_text().splitlines():
        line = line.strip()
        header = re.fullmatch(r"\[(.+)\]", line)
        if header:
            section = header.group(1).replace('"', "")
            found[section] = {}
            continue
        pair = re.fullmatch(r'([\w.-]+)\s*=\s*"([^"]*)"', line)
        if pair and section:
            found[section][pair.group(1)] = pair.group(2)
    return found


def project() -> dict:
    """[project], and its entry points by group."""
    sections = _sections()
    prefix = "project.entry-points."
    meta = dict(sections["project"])
    meta["entry_points"] = {
        name.removeprefix(prefix): points
        for name, points in sections.items()
        if name.startswith(prefix)
    }
    return meta


# The import package: the one vLLM's entry point names ("<package>:register"
# in pyproject.toml, where the tool and the tests read it too).
PACKAGE = next(iter(project()["entry_points"]["vllm.general_plugins"].values()))
PACKAGE = PACKAGE.partition(":")[0]
PLUGIN_IMPORT = f"from {PACKAGE}._xpu_gemm_fakes import "


def shipped(name: str) -> bytes:
    """An overlay module as the plugin ships it (from the checkout, or from
    the package itself when building from an sdist)."""
    if FROM_SDIST:
        return (HERE / PACKAGE / name).read_bytes()
    if name in SHIPPED_AS_IS:
        return SHIPPED_AS_IS[name].read_bytes()
    source = OVERLAY / name
    return source.read_text().replace(OVERLAY_IMPORT, PLUGIN_IMPORT).encode()


def license_text() -> bytes:
    """The repository's LICENSE (an sdist's own copy when building from it)."""
    return ((HERE if FROM_SDIST else REPO) / LICENSE).read_bytes()


_LINK = re.compile(r"(!?)\[([^\]]*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^\s>]+)", re.MULTILINE)
_ABSOLUTE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # a URL scheme


def _on_an_index(match: re.Match) -> str:
    _, text, target = match.groups()
    if _ABSOLUTE.match(target):
        return match.group(0)
    path = target.partition("#")[0]
    if not path:  # an anchor in the page
        return text
    where = posixpath.normpath(posixpath.join(posixpath.dirname(PAGE), path))
    return f"{text} (`{where}`)"


def index_page(page: str) -> str:
    """The plugin's page as the wheel's description (the module's
    docstring says how)."""
    for target in _REFERENCE.findall(page):
        if not _ABSOLUTE.match(target):
            raise ValueError(
                f"{PAGE}: a reference-style link to {target!r}, a relative path:"
                " write it inline (the description turns it into its text)"
            )
    return _LINK.sub(_on_an_index, page).rstrip("\n") + "\n" + CLOSING


def description() -> str:
    """The wheel's description (an sdist's README.md when building from it)."""
    if FROM_SDIST:
        return (HERE / README).read_text(encoding="utf-8")
    return index_page((REPO / PAGE).read_text(encoding="utf-8"))


def package_files() -> dict[str, bytes]:
    """The package's files by path in the wheel, sorted."""
    files = {}
    for path in sorted((HERE / PACKAGE).glob("*.py")):
        if path.name not in (*SHIPPED, *SHIPPED_AS_IS):
            files[f"{PACKAGE}/{path.name}"] = path.read_bytes()
    for name in (*SHIPPED, *SHIPPED_AS_IS):
        files[f"{PACKAGE}/{name}"] = shipped(name)
    return dict(sorted(files.items()))


def _dist_info(meta: dict) -> str:
    return f"{PACKAGE}-{meta['version']}.dist-info"


def metadata_files(meta: dict) -> dict[str, bytes]:
    """The .dist-info's files but RECORD. Core metadata 2.4 (PEP 639):
    License-Expression (not License, which 2.4 says not to give with it),
    License-File; the description is METADATA's body."""
    lines = [
        "Metadata-Version: 2.4",
        f"Name: {meta['name']}",
        f"Version: {meta['version']}",
        f"Summary: {meta['description']}",
        f"License-Expression: {meta['license']}",
        f"License-File: {LICENSE}",
        f"Requires-Python: {meta['requires-python']}",
        f"Description-Content-Type: {DESCRIPTION_TYPE}",
    ]
    entry_points = []
    for group, points in meta["entry_points"].items():
        entry_points += [f"[{group}]", *(f"{k} = {v}" for k, v in points.items())]
    info = _dist_info(meta)
    return {
        f"{info}/METADATA": ("\n".join(lines) + "\n\n" + description()).encode(),
        f"{info}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: vllm_xpu_fakes_build\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{info}/entry_points.txt": ("\n".join(entry_points) + "\n").encode(),
        f"{info}/licenses/{LICENSE}": license_text(),
    }


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _zip_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, DATE)
    info.external_attr = 0o644 << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info


def wheel_name(meta: dict | None = None) -> str:
    meta = meta or project()
    return f"{PACKAGE}-{meta['version']}-py3-none-any.whl"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    meta = project()
    files = package_files() | metadata_files(meta)
    record = f"{_dist_info(meta)}/RECORD"
    rows = [f"{name},{_record_hash(data)},{len(data)}" for name, data in files.items()]
    files[record] = ("\n".join([*rows, f"{record},,"]) + "\n").encode()
    target = Path(wheel_directory) / wheel_name(meta)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with zipfile.ZipFile(partial, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(_zip_info(name), data)
    os.replace(partial, target)
    return target.name


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    meta = project()
    for name, data in metadata_files(meta).items():
        path = Path(metadata_directory) / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return _dist_info(meta)


def build_sdist(sdist_directory, config_settings=None):
    meta = project()
    base = f"{PACKAGE}-{meta['version']}"
    files = {
        "pyproject.toml": (HERE / "pyproject.toml").read_bytes(),
        "vllm_xpu_fakes_build.py": Path(__file__).read_bytes(),
        LICENSE: license_text(),
        README: description().encode(),
        **package_files(),
    }
    pkg_info = metadata_files(meta)[f"{_dist_info(meta)}/METADATA"]
    files["PKG-INFO"] = pkg_info
    target = Path(sdist_directory) / f"{base}.tar.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(target, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w", format=tarfile.PAX_FORMAT) as sdist,
    ):
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"{base}/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            sdist.addfile(info, io.BytesIO(data))
    return target.name


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


if __name__ == "__main__":  # make plugin: python3 plugin/vllm_xpu_fakes_build.py DIR
    import sys

    out = Path(sys.argv[1] if len(sys.argv) > 1 else "dist")
    print(out / build_wheel(out))

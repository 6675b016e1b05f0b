"""The fix as a vLLM plugin (plugin/, `make plugin`): its wheel (its
LICENSE and description, the sdist that builds the same wheel), one source
with the series' overlay, pip install and uninstall, and register() in a
process that has loaded a release's own files against the stand-in kernels.

Each runtime test loads the release's unpatched file (vllm/_xpu_ops.py or
vllm/_ipex_ops.py) in a forked process (registrations are process-global)
and checks the same thing before and after the plugin's register(): the
unpatched release is each test's negative control. The plugin is the wheel
`make plugin` builds, unpacked as pip installs it. The whole model with the
plugin: tests/test_model_trace.py; vLLM's engine with it: make e2e.
"""

import base64
import contextlib
import email.parser
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import types
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from packaging.metadata import Metadata

from support import grid, images, releases, standins, tool
from support import plugin as plugin_support
from xpufakes.common import paths
from xpufakes.proof import verify
from xpufakes.proof.xpu import extensions, registering, xpu_kernels
from xpufakes.proof.xpu import ipex as ipex_standin

OVERLAY = paths.REPO / "vllm_overlay" / "vllm"
PACKAGE = plugin_support.PACKAGE
REWRITE = (
    "from vllm._xpu_gemm_fakes import ",
    f"from {PACKAGE}._xpu_gemm_fakes import ",
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plugin's wheel, unpacked as pip installs it."""
    return plugin_support.installed(tmp_path_factory.mktemp("plugin"))


# ---------------------------------------------------------------------------
# The wheel
# ---------------------------------------------------------------------------


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as files:
        return {name: files.read(name) for name in files.namelist()}


def test_make_plugin_writes_a_reproducible_pure_python_wheel(tmp_path):
    wheel = plugin_support.build(tmp_path / "a")
    again = plugin_support.build(tmp_path / "b")
    assert wheel.read_bytes() == again.read_bytes()
    members = _members(wheel)
    info = next(n.split("/")[0] for n in members if n.endswith(".dist-info/WHEEL"))
    assert "Tag: py3-none-any" in members[f"{info}/WHEEL"].decode()
    assert "Root-Is-Purelib: true" in members[f"{info}/WHEEL"].decode()
    meta = members[f"{info}/METADATA"].decode()
    assert "Name: vllm-xpu-fakes" in meta and "Requires-Dist" not in meta
    assert members[f"{info}/entry_points.txt"].decode().splitlines() == [
        "[vllm.general_plugins]",
        "xpu_fakes = vllm_xpu_fakes:register",
    ]
    # RECORD lists every other member with its hash and size
    rows = members[f"{info}/RECORD"].decode().splitlines()
    listed = {row.split(",")[0]: row for row in rows}
    assert set(listed) == set(members)
    for name, data in members.items():
        if name != f"{info}/RECORD":
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest())
            hashed = digest.rstrip(b"=").decode()
            assert listed[name] == f"{name},sha256={hashed},{len(data)}"
    # the package's modules and the .dist-info's files, nothing else
    assert {
        n.removeprefix(f"{info}/") for n in members if n.startswith(f"{info}/")
    } == {"METADATA", "WHEEL", "entry_points.txt", "RECORD", "licenses/LICENSE"}
    assert all(
        n.startswith(f"{PACKAGE}/") and n.endswith(".py")
        for n in members
        if not n.startswith(f"{info}/")
    )


def overlay_differences(wheel: Path, overlay: Path) -> list[str]:
    """How the wheel's copies of the overlay's modules differ from the
    overlay, beyond the one import that names the package they are in."""
    members = _members(wheel)
    found = []
    for module in sorted(overlay.glob("*.py")):
        shipped = members.get(f"{PACKAGE}/{module.name}")
        if shipped is None:
            found.append(f"{module.name}: not shipped")
            continue
        expected = module.read_text().replace(*REWRITE)
        if shipped.decode() != expected:
            found.append(f"{module.name}: differs")
        if "from vllm._" in shipped.decode() or "import vllm._" in shipped.decode():
            found.append(f"{module.name}: imports an overlay module from vllm")
    return found


def test_the_plugin_ships_the_series_overlay_modules(tmp_path):
    """One source: every module the series adds to vllm/ is in the plugin,
    byte for byte but for the import of its own package's fakes. Negative
    controls: a module the plugin does not ship, and a shipped copy edited."""
    wheel = plugin_support.build(tmp_path / "dist")
    assert overlay_differences(wheel, OVERLAY) == []
    assert sum(REWRITE[0] in p.read_text() for p in OVERLAY.glob("*.py")) == 1
    # a new overlay module that the build does not ship
    more = tmp_path / "overlay"
    more.mkdir()
    for module in OVERLAY.glob("*.py"):
        (more / module.name).write_bytes(module.read_bytes())
    (more / "_xpu_new_fakes.py").write_text("x = 1\n")
    assert overlay_differences(wheel, more) == ["_xpu_new_fakes.py: not shipped"]
    # a shipped copy that is not the overlay's
    members = _members(wheel)
    name = f"{PACKAGE}/_xpu_gemm_fakes.py"
    edited = tmp_path / "edited.whl"
    with zipfile.ZipFile(edited, "w") as files:
        for member, data in members.items():
            files.writestr(member, data + b"# edited\n" if member == name else data)
    assert overlay_differences(edited, OVERLAY) == ["_xpu_gemm_fakes.py: differs"]


def _info(members: dict[str, bytes]) -> str:
    """The wheel's .dist-info directory."""
    return next(n.split("/")[0] for n in members if n.endswith(".dist-info/WHEEL"))


# The Apache License 2.0 as the ASF distributes it (LICENSE-2.0.txt, the
# same bytes as Debian's /usr/share/common-licenses/Apache-2.0): its size
# and SHA-256.
APACHE_2_0 = (11358, "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30")
PAGE = paths.REPO / "docs" / "plugin.md"


def license_problems(text: bytes) -> list[str]:
    digest = hashlib.sha256(text).hexdigest()
    if (len(text), digest) == APACHE_2_0:
        return []
    return [f"LICENSE: {len(text)} bytes, sha256 {digest[:12]}..., not the ASF's text"]


def metadata_problems(members: dict[str, bytes]) -> list[str]:
    """What is wrong with the wheel's METADATA and its license files: the
    reference parser's validation (packaging.metadata: each field allowed
    in the declared core metadata version, the SPDX expression, the
    License-File paths), then what it does not check: License beside
    License-Expression (core metadata 2.4: mutually exclusive), each
    License-File in .dist-info/licenses/, the license's text, a markdown
    description."""
    info = _info(members)
    text = members[f"{info}/METADATA"].decode()
    try:
        meta = Metadata.from_email(text, validate=True)
    except ExceptionGroup as invalid:
        return [str(e) for e in invalid.exceptions]
    problems = []
    headers = email.parser.HeaderParser().parsestr(text)
    if "License" in headers and "License-Expression" in headers:
        problems.append("License beside License-Expression")
    if meta.license_expression != "Apache-2.0":
        problems.append(f"License-Expression {meta.license_expression!r}")
    if not meta.license_files:
        problems.append("no License-File")
    for name in meta.license_files or ():
        shipped = members.get(f"{info}/licenses/{name}")
        if shipped is None:
            problems.append(f"License-File {name}: not in {info}/licenses/")
        else:
            problems += license_problems(shipped)
    if meta.description_content_type != "text/markdown" or not meta.description:
        problems.append("no markdown description")
    return problems


_RELATIVE_LINK = re.compile(r"\]\((?![A-Za-z][A-Za-z0-9+.-]*:)([^)]*)\)")


def description_problems(description: str, page: str) -> list[str]:
    """The description is the plugin's page for a package index: its title
    first, every line of the page that has no link, in order, and no link
    to a relative path (which nothing on an index resolves)."""
    problems = [
        f"a relative link on an index: ({target})"
        for target in _RELATIVE_LINK.findall(description)
    ]
    if description.splitlines()[:1] != page.splitlines()[:1]:
        problems.append("does not start with the page's title")
    lines = iter(description.splitlines())
    for line in page.splitlines():
        if "](" not in line and not any(line == kept for kept in lines):
            problems.append(f"the page's line {line!r} is not in it (in order)")
            break
    return problems


def pyproject_problems(project: dict, meta: Metadata) -> list[str]:
    """PEP 621: a field in METADATA is pyproject.toml's [project] value, or
    listed in its `dynamic` (a backend may fill in nothing else)."""
    dynamic = project.get("dynamic", [])
    problems = []
    for key, value in {
        "name": meta.name,
        "version": str(meta.version),
        "description": meta.summary,
        "requires-python": str(meta.requires_python),
        "license": meta.license_expression,
        "readme": meta.description,
    }.items():
        if key in project and key in dynamic:
            problems.append(f"{key}: both static and dynamic")
        elif key in project and key != "readme" and project[key] != value:
            problems.append(f"{key}: {project[key]!r} in pyproject.toml, {value!r}")
        elif key not in project and key not in dynamic and value:
            problems.append(f"{key}: in METADATA, neither static nor dynamic")
    return problems


def test_the_wheel_carries_the_license_and_the_plugins_page(tmp_path):
    """The repository's LICENSE is the Apache License 2.0 verbatim, and the
    wheel carries it as core metadata 2.4 says (License-File, the file in
    .dist-info/licenses/); METADATA passes packaging's validation; its
    description is docs/plugin.md with no relative link; pyproject.toml
    declares what the backend fills in. Negative controls: one change each
    to METADATA, the license, the description, pyproject.toml."""
    members = _members(plugin_support.build(tmp_path / "dist"))
    info = _info(members)
    license_file = (paths.REPO / "LICENSE").read_bytes()
    assert license_problems(license_file) == []
    assert members[f"{info}/licenses/LICENSE"] == license_file
    assert metadata_problems(members) == []
    meta = Metadata.from_email(members[f"{info}/METADATA"].decode())
    page = PAGE.read_text()
    assert description_problems(meta.description, page) == []
    project = tomllib.loads((paths.REPO / "plugin" / "pyproject.toml").read_text())
    assert pyproject_problems(project["project"], meta) == []

    def changed(name: str, old: bytes | None, new: bytes | None) -> list[str]:
        edited = dict(members)
        if old is None:
            del edited[f"{info}/{name}"]
        else:
            assert old in edited[f"{info}/{name}"], "the control no longer matches"
            edited[f"{info}/{name}"] = edited[f"{info}/{name}"].replace(old, new, 1)
        return metadata_problems(edited)

    assert any(
        "license-file introduced in metadata version 2.4" in p
        for p in changed("METADATA", b"Metadata-Version: 2.4", b"Metadata-Version: 2.1")
    )
    assert changed(
        "METADATA", b"License-File: LICENSE", b"License-File: LICENSE\nLicense: MIT"
    ) == ["License beside License-Expression"]
    assert changed("licenses/LICENSE", None, None) == [
        f"License-File LICENSE: not in {info}/licenses/"
    ]
    # the text as some packages ship it, without its appendix
    cut = changed("licenses/LICENSE", b"\n   APPENDIX", b"\n   END")
    assert len(cut) == 1 and "not the ASF's text" in cut[0]
    assert changed(
        "METADATA", b"Content-Type: text/markdown", b"Content-Type: text/plain"
    ) == ["no markdown description"]
    # the description with a relative link, as the page on the repository
    linked = meta.description.replace("\n", "\nSee [the tests](testing.md).\n", 1)
    assert description_problems(linked, page) == [
        "a relative link on an index: (testing.md)"
    ]
    lost = meta.description.replace("`VLLM_PLUGINS`", "VLLM_PLUGINS")
    assert len(description_problems(lost, page)) == 1
    del project["project"]["dynamic"]
    assert pyproject_problems(project["project"], meta) == [
        "readme: in METADATA, neither static nor dynamic"
    ]


def test_the_wheels_description_reads_on_a_package_index():
    """The backend's rewrite of the page's links: a relative path becomes
    the repository path it names, an anchor its text, an absolute link
    stays; a reference-style link to a relative path is refused. Negative
    control: the page as written fails description_problems."""
    backend = plugin_support.backend()
    page = (
        "# The plugin\n"
        "See [the tests](testing.md#faults), [the README](../README.md),\n"
        "[vLLM](https://docs.vllm.ai/en/latest/) and [below](#the-cache).\n"
        "![a figure](img/x.png)\n"
    )
    written = backend.index_page(page)
    assert written.startswith(
        "# The plugin\n"
        "See the tests (`docs/testing.md`), the README (`README.md`),\n"
        "[vLLM](https://docs.vllm.ai/en/latest/) and below.\n"
        "a figure (`docs/img/x.png`)\n"
    )
    assert "`docs/plugin.md`" in written.splitlines()[-1]
    assert description_problems(written, page) == []
    assert len(description_problems(page, page)) == 4
    with pytest.raises(ValueError, match="'testing.md', a relative path"):
        backend.index_page(page + "\n[1]: testing.md\n")
    assert backend.index_page(page + "\n[1]: https://docs.vllm.ai/\n")


def test_an_sdist_builds_the_same_wheel(tmp_path):
    """The backend's sdist (reproducible) carries LICENSE, the description
    and PKG-INFO (the wheel's METADATA), and pip builds from it, offline,
    the wheel of `make plugin`, byte for byte. Negative controls: the sdist
    without its LICENSE builds no wheel; its README.md edited, another one."""
    backend = plugin_support.backend()
    wheel = plugin_support.build(tmp_path / "dist")
    members = _members(wheel)
    sdist = tmp_path / "sdist" / backend.build_sdist(tmp_path / "sdist")
    again = tmp_path / "again" / backend.build_sdist(tmp_path / "again")
    assert sdist.read_bytes() == again.read_bytes()
    base = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as files:
        files.extractall(tmp_path / "unpacked", filter="data")
    unpacked = tmp_path / "unpacked" / base
    assert (unpacked / "PKG-INFO").read_bytes() == members[f"{_info(members)}/METADATA"]
    assert (unpacked / "LICENSE").read_bytes() == (paths.REPO / "LICENSE").read_bytes()
    done = subprocess.run(
        [sys.executable, "-m", "pip", "-q", "--no-cache-dir", "wheel", "--no-index"]
        + ["--no-deps", str(sdist), "-w", str(tmp_path / "pip")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "pip" / wheel.name).read_bytes() == wheel.read_bytes()

    def build(out: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(unpacked / "vllm_xpu_fakes_build.py")]
            + [str(tmp_path / out)],
            capture_output=True,
            text=True,
        )

    assert build("direct").returncode == 0
    assert (tmp_path / "direct" / wheel.name).read_bytes() == wheel.read_bytes()
    readme = unpacked / "README.md"
    readme.write_text(readme.read_text() + "edited\n")
    assert build("edited").returncode == 0
    assert (tmp_path / "edited" / wheel.name).read_bytes() != wheel.read_bytes()
    (unpacked / "LICENSE").unlink()
    done = build("unlicensed")
    assert done.returncode != 0 and "LICENSE" in done.stderr, done.stderr
    assert not (tmp_path / "unlicensed" / wheel.name).exists()


def _site(venv: Path) -> Path:
    (lib,) = (venv / "lib").glob("python*/site-packages")
    return lib


def _site_files(venv: Path, dirs: bool = False) -> set[str]:
    """site-packages' files (and directories) but bytecode, relative."""
    lib = _site(venv)
    return {
        str(p.relative_to(lib))
        for p in lib.rglob("*")
        if "__pycache__" not in p.parts and (dirs or p.is_file())
    }


def test_pip_installs_the_directory_offline_and_uninstall_leaves_nothing(tmp_path):
    """`pip install ./plugin` (the build backend, nothing downloaded:
    --no-index) gives the wheel of `make plugin`, its license and metadata
    byte for byte; vLLM finds the entry point; `pip uninstall` removes every
    file and directory it installed."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--no-cache-dir"]
    before, dirs = _site_files(venv), _site_files(venv, dirs=True)
    done = subprocess.run(
        [*pip, "install", "--no-index", str(paths.REPO / "plugin")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    added = _site_files(venv) - before
    wheel = plugin_support.build(tmp_path / "dist")
    expected = {n for n in _members(wheel)}
    info = next(n.split("/")[0] for n in expected if n.endswith("/WHEEL"))
    # pip adds its own bookkeeping to the .dist-info, and rewrites RECORD
    assert {a for a in added if not a.startswith(info)} == {
        e for e in expected if not e.startswith(info)
    }
    members = _members(wheel)
    for name, data in members.items():
        if name != f"{info}/RECORD":
            assert (_site(venv) / name).read_bytes() == data, name
    assert f"{info}/licenses/LICENSE" in added
    found = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from importlib.metadata import entry_points;"
            "print([e.value for e in entry_points(group='vllm.general_plugins')])",
        ],
        capture_output=True,
        text=True,
    )
    assert found.stdout.strip() == "['vllm_xpu_fakes:register']", found
    assert not (paths.REPO / "plugin" / "build").exists()  # the checkout untouched
    done = subprocess.run([*pip, "uninstall", "-y", "vllm-xpu-fakes"], check=True)
    assert _site_files(venv) == before
    assert _site_files(venv, dirs=True) == dirs  # no directory left either


# ---------------------------------------------------------------------------
# register() on the releases' own files (forked: registrations are global)
# ---------------------------------------------------------------------------


def _load_release(tree: Path, release: str) -> list:
    """The stand-in kernels, IPEX's stand-in, then the release's registering
    module, as vLLM imports it on an XPU; the libraries to keep."""
    sys.dont_write_bytecode = True
    libraries = standins.define_standins(release)
    if releases.era(release) == "ipex":
        ipex_standin.install_ipex()
    standins.import_vllm_module(tree, release)
    return libraries


def _plugin(site: Path, monkeypatch) -> types.ModuleType:
    monkeypatch.setenv("VLLM_XPU_FAKES_ANY_PLATFORM", "1")
    sys.path.insert(0, str(site))
    import vllm_xpu_fakes

    assert Path(vllm_xpu_fakes.__file__).is_relative_to(site)
    return vllm_xpu_fakes


def _owner(qualname: str) -> str:
    """The module of the fake registered for an op ('' if none): torch
    keeps the function it was given inside its own wrappers."""
    fake = registering.fake_of(qualname)
    while fake is not None and fake.__module__.startswith("torch."):
        inner = getattr(fake, "func", None) or next(
            (
                c.cell_contents
                for c in getattr(fake, "__closure__", None) or ()
                if callable(c.cell_contents)
            ),
            None,
        )
        if inner is None:
            break
        fake = inner
    return "" if fake is None else fake.__module__


@contextlib.contextmanager
def _logged():
    """The plugin's log lines (vLLM's logger does not propagate to pytest's
    capture)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("vllm.vllm_xpu_fakes")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


WRONG_ON_UNPATCHED = {"3d", "3d-mbk", "row-sliced"}
BMM = ("vllm::xpu_fp8_bmm", "_xpu_C::fp8_bmm")  # vLLM's op, the GEMM it returns


def _wrong_on_unpatched() -> list:
    """The grid's cases vLLM's own fakes (0.20.0 on) fail: fp8_gemm_w8a16 on
    3-D, transposed and row-sliced inputs, fp8_gemm with out_dtype None."""
    return [
        c
        for c in grid.cases()
        if c.namespace == "_xpu_C"
        and (
            (c.name == "fp8_gemm_w8a16" and c.params["layout"] in WRONG_ON_UNPATCHED)
            or (c.name == "fp8_gemm" and c.params.get("out_dtype", 0) is None)
        )
    ]


@pytest.mark.forked
@pytest.mark.parametrize("kernels", ["0.32.0", "0.33.0"])
def test_kernels_era_plugin_replaces_vllms_wrong_fakes(kernels, site, monkeypatch):
    """vLLM's own fakes, registered when its _xpu_ops.py is imported, fail
    the grid's 3-D, strided and out_dtype=None cases; after register() every
    case passes and every fake, vllm::xpu_fp8_bmm's included, is the
    plugin's."""
    release = kernels
    libraries = _load_release(releases.pristine(release), release)  # noqa: F841
    wrong = _wrong_on_unpatched()
    failed = grid.failures(grid.run(wrong))
    assert wrong and all(c.id in failed for c in wrong), failed
    assert any("dtype" in why.lower() for why in failed.values()), failed
    bmm_before: dict = {}
    verify._check_wrapper(
        bmm_before, "vllm::xpu_fp8_bmm", "_xpu_C::fp8_bmm", "cpu", False
    )
    if release == "0.33.0":
        assert bmm_before["vllm::xpu_fp8_bmm"].failed > 0

    plugin = _plugin(site, monkeypatch)
    plugin.register()
    assert grid.failures(grid.run()) == {}
    state = plugin.state()
    assert state["differs"] == [], state
    for qualname in state["registered"]:
        assert _owner(qualname) == f"{PACKAGE}._xpu_gemm_fakes", qualname
    assert "_xpu_C::fp8_gemm_w8a16" in state["registered"]
    bmm_after: dict = {}
    verify._check_wrapper(
        bmm_after, "vllm::xpu_fp8_bmm", "_xpu_C::fp8_bmm", "cpu", False
    )
    if release == "0.33.0":
        assert "vllm::xpu_fp8_bmm" in state["registered"]
        result = bmm_after["vllm::xpu_fp8_bmm"]
        assert result.failed == 0 and result.passed > 0, result.failures


@pytest.mark.forked
@pytest.mark.parametrize("schema", ["image", "renamed"])
def test_the_plugin_keeps_a_tree_fake_it_is_not_exact_for(schema, site, monkeypatch):
    """Do no harm, the plugin's way in, on llm-scaler 0.21.0-b3.1 as it is:
    the image's fp8_gemm_w8a16 schema (read from its kernels patch) gets
    ours, the fake of that build; with an argument renamed (a schema we do
    not know) the tree's own fake stays, and the plugin says so."""
    sys.dont_write_bytecode = True
    live = images.image_schema(images.kernels_patch(), images.W8A16)
    if schema == "renamed":
        live = live.replace("(Tensor A,", "(Tensor input,", 1)
    library = torch.library.Library("_xpu_C", "FRAGMENT")  # noqa: F841
    library.define(live)
    libraries = standins.define_standins("0.21.0")  # noqa: F841 - the others
    xpu_kernels.stub_xpu_kernel_package()
    sys.path.insert(0, str(images.b31_cached()))
    registering.import_registering_module(None)
    assert _owner(images.W8A16) == "vllm._xpu_ops"
    plugin = _plugin(site, monkeypatch)
    plugin.register()
    state = plugin.state()
    if schema == "image":
        assert _owner(images.W8A16) == f"{PACKAGE}._xpu_gemm_fakes"
        assert images.W8A16 in state["registered"], state
    else:
        assert _owner(images.W8A16) == "vllm._xpu_ops"
        assert images.W8A16 not in state["registered"], state
        assert any(d.startswith(images.W8A16) for d in state["differs"]), state


@pytest.mark.forked
def test_plugin_imports_vllms_registering_module_first(site, monkeypatch):
    """register() in a process that has not imported vllm/_xpu_ops.py yet
    (the plugin runs before vLLM's XPU code is imported): it imports it
    first, so the newest registration, the one that wins, is the plugin's."""
    tree = releases.pristine("0.33.0")
    libraries = standins.define_standins("0.33.0")  # noqa: F841
    xpu_kernels.stub_xpu_kernel_package()
    sys.path.insert(0, str(tree))
    assert "vllm._xpu_ops" not in sys.modules
    plugin = _plugin(site, monkeypatch)
    plugin.register()
    assert Path(sys.modules["vllm._xpu_ops"].__file__).is_relative_to(tree)
    assert _owner("_xpu_C::fp8_gemm_w8a16") == f"{PACKAGE}._xpu_gemm_fakes"
    assert grid.failures(grid.run(_wrong_on_unpatched())) == {}


@pytest.mark.forked
def test_fakes_registered_before_vllms_lose_on_this_torch(site, monkeypatch):
    """The negative control of the order: the same fakes registered before
    vLLM's module is imported (torch 2.13: register_fake overrides by
    default) leave vLLM's wrong fakes in place."""
    tree = releases.pristine("0.33.0")
    libraries = standins.define_standins("0.33.0")  # noqa: F841
    xpu_kernels.stub_xpu_kernel_package()
    sys.path.insert(0, str(site))
    from vllm_xpu_fakes import _xpu_gemm_fakes

    assert "_xpu_C::fp8_gemm_w8a16" in _xpu_gemm_fakes.register_xpu_gemm_fakes()
    standins.import_vllm_module(tree, "0.33.0")
    assert _owner("_xpu_C::fp8_gemm_w8a16") == "vllm._xpu_ops"
    assert grid.failures(grid.run(_wrong_on_unpatched()))


@pytest.mark.forked
def test_ipex_era_plugin_registers_the_ipex_gemm_fake(site, monkeypatch):
    """0.14.1 unpatched: torch_ipex::fp8_gemm_w8a16 has no fake (the
    report's error); after register() its fake is the plugin's and passes
    the grid, IPEX's WOQ linear modules are wrapped, IPEX's untraceable
    APIs are rebound. A second register() does nothing new and logs nothing."""
    libraries = _load_release(releases.pristine("0.14.1"), "0.14.1")  # noqa: F841
    assert registering.fake_of("torch_ipex::fp8_gemm_w8a16.xpu") is None
    plugin = _plugin(site, monkeypatch)
    with _logged() as first:
        plugin.register()
    with _logged() as second:
        plugin.register()
    state = plugin.state()
    assert state["registered"] == ["torch_ipex::fp8_gemm_w8a16.xpu"], state
    assert _owner("torch_ipex::fp8_gemm_w8a16.xpu") == f"{PACKAGE}._xpu_gemm_fakes"
    ipex = [c for c in grid.cases() if c.namespace == "torch_ipex"]
    results = grid.run(ipex)
    assert results and grid.failures(results) == {}
    assert "IPEXWeightOnlyQuantizedLinear.from_weight" in state["woq"]
    assert "intel_extension_for_pytorch.llm.functional.silu_and_mul" in state["rebound"]
    assert len(first) == 1 and first[0].startswith("vllm-xpu-fakes: fakes registered:")
    assert second == [] and state["calls"] == 2


@pytest.mark.forked
def test_register_does_nothing_off_xpu_and_never_raises(site, monkeypatch):
    libraries = _load_release(releases.pristine("0.14.1"), "0.14.1")  # noqa: F841
    monkeypatch.delenv("VLLM_XPU_FAKES_ANY_PLATFORM", raising=False)
    sys.path.insert(0, str(site))
    import vllm_xpu_fakes
    from vllm_xpu_fakes import plugin

    with _logged() as said:
        vllm_xpu_fakes.register()
    assert plugin.state()["skipped"].startswith("the platform is not XPU"), said
    assert plugin.state()["registered"] == []
    assert registering.fake_of("torch_ipex::fp8_gemm_w8a16.xpu") is None
    assert said == [
        f"vllm-xpu-fakes: {plugin.state()['skipped']}: nothing to do "
        f"({plugin.state()['seconds']:.3f} s)"
    ]


# ---------------------------------------------------------------------------
# All or nothing: a fault in each step of register()
# ---------------------------------------------------------------------------

FUNCTIONAL = "intel_extension_for_pytorch.llm.functional"


class Fault(RuntimeError):
    pass


def _after(call: Callable, count: int, which: Callable, at_fault: Callable):
    """`call`, which raises Fault after it has done its work the `count`-th
    time it is called with arguments that `which` accepts (the fault comes
    after a change: the hardest case to undo); `at_fault()` runs first."""
    seen = [0]

    def faulty(*args, **kwargs):
        result = call(*args, **kwargs)
        if which(*args):
            seen[0] += 1
            if seen[0] == count:
                at_fault()
                raise Fault(f"injected after change {count}")
        return result

    return faulty


def _snapshot(ipex, copies) -> dict:
    """What callers see, by identity: IPEX's functions, vLLM's module that
    holds copies and its class, IPEX's WOQ class's from_weight."""
    woq = ipex.llm.quantization.woq_linear.IPEXWeightOnlyQuantizedLinear
    return {
        **{f"{FUNCTIONAL}.{k}": id(v) for k, v in vars(ipex.llm.functional).items()},
        **{f"copies.{k}": id(v) for k, v in vars(copies).items()},
        **{f"Holder.{k}": id(v) for k, v in vars(copies.Holder).items()},
        "from_weight": id(vars(woq)["from_weight"]),
    }


# where the fault is injected -> (the step, the change after which it comes,
# the keys of _snapshot that step changes)
FAULTS = {
    "registering": ("fakes", 1, ()),
    "wrapping": ("woq", 1, ("from_weight",)),
    "rebinding": ("rebind", 3, (FUNCTIONAL, "copies.", "Holder.")),
    "sweeping modules": ("rebind", 2, (FUNCTIONAL, "copies.", "Holder.")),
    "sweeping classes": ("rebind", 1, (FUNCTIONAL, "copies.", "Holder.")),
}


@pytest.mark.forked
@pytest.mark.parametrize("where", list(FAULTS))
def test_a_fault_in_a_step_is_undone_said_and_retried(where, site, monkeypatch):
    """A fault injected into each step of register(), after that step has
    changed something (the negative control: what callers see differs from
    before at the moment of the fault): the step is undone completely
    (every callee, copy, class attribute as before; the state lists nothing
    of it), the one line says which step failed and that it was undone,
    register() does not raise, and the next register() makes the whole fix.
    A fake torch refuses is not registered, said, and retried."""
    libraries = _load_release(releases.pristine("0.14.1"), "0.14.1")
    libraries.append(ipex_standin.define_torch_ipex_ops())
    import intel_extension_for_pytorch as ipex

    copies = _vllm_module("vllm.fault_copies", FAULT_COPIES)
    before = _snapshot(ipex, copies)
    plugin_package = _plugin(site, monkeypatch)
    from vllm_xpu_fakes import _xpu_gemm_fakes as fakes
    from vllm_xpu_fakes import plugin

    step, count, touched = FAULTS[where]
    ours = lambda snap: {k: v for k, v in snap.items() if k.startswith(touched)}  # noqa: E731
    at_fault = []
    if where == "registering":  # torch registers a fake whole or not at all

        def refused(*args):
            at_fault.append(True)
            raise Fault("injected after change 1: torch refused the fake")

        monkeypatch.setattr(fakes, "_register", refused)
    else:

        def moment():
            at_fault.append(ours(_snapshot(ipex, copies)) != ours(before))

        if where == "sweeping modules":
            which = lambda journal, mapping, *_: mapping is vars(copies)  # noqa: E731
            monkeypatch.setattr(
                plugin._Journal,
                "setitem",
                _after(plugin._Journal.setitem, count, which, moment),
            )
        else:
            owner = {
                "wrapping": lambda o: isinstance(o, type),
                "rebinding": lambda o: o is ipex.llm.functional,
                "sweeping classes": lambda o: o is copies.Holder,
            }[where]
            monkeypatch.setattr(
                plugin._Journal,
                "setattr",
                _after(
                    plugin._Journal.setattr,
                    count,
                    lambda journal, o, *_: owner(o),
                    moment,
                ),
            )
    with _logged() as said:
        plugin_package.register()  # does not raise
    state = plugin.state()
    assert at_fault == [True], "the fault came before any change"
    assert state["steps"][step].startswith("failed ("), state["steps"]
    assert "Fault: injected after change" in state["steps"][step]
    lines = [s for s in said if s.startswith("vllm-xpu-fakes: ")]
    assert len(lines) == 1 and f"{step}: failed (" in lines[0], said
    if step == "fakes":  # the others stay registered; this one is retried
        assert "tried again at the next call" in lines[0]
        assert state["registered"] == []
        assert registering.fake_of("torch_ipex::fp8_gemm_w8a16.xpu") is None
    else:
        assert "undone, as vLLM has it" in lines[0]
        assert ours(_snapshot(ipex, copies)) == ours(before)
        if step == "rebind":
            assert state["rebound"] == [] and state["copies"] == []
            assert "calls rebound to custom ops: none" in lines[0]
        else:
            assert state["woq"] == "" and "WOQ" not in lines[0]

    monkeypatch.undo()  # the fault is gone; the next call makes the whole fix
    monkeypatch.setenv("VLLM_XPU_FAKES_ANY_PLATFORM", "1")
    with _logged() as said:
        plugin_package.register()
    state = plugin.state()
    assert set(state["steps"].values()) == {"done"}, state["steps"]
    assert state["registered"] == ["torch_ipex::fp8_gemm_w8a16.xpu"]
    assert f"{FUNCTIONAL}.silu_and_mul" in state["rebound"]
    assert "vllm.fault_copies.silu_and_mul" in state["copies"]
    assert "vllm.fault_copies.Holder.norm" in state["copies"]
    assert state["woq"]
    assert len(said) == 1 and "failed" not in said[0], said


@pytest.mark.forked
def test_a_fault_in_the_holder_search_is_said_and_changes_nothing(site, monkeypatch):
    """unreached(), the whole-heap search (the self-check and the audit run
    it, never register()): a fault in it says the search failed, changes
    nothing, and the search works again after."""
    libraries = _load_release(releases.pristine("0.14.1"), "0.14.1")
    libraries.append(ipex_standin.define_torch_ipex_ops())
    copies = _vllm_module("vllm.fault_copies", FAULT_COPIES)
    plugin_package = _plugin(site, monkeypatch)
    from vllm_xpu_fakes import plugin

    plugin_package.register()
    state = plugin.state()
    import gc

    def broken(*objects):
        raise Fault("injected into the search")

    monkeypatch.setattr(gc, "get_referrers", broken)
    assert plugin.unreached() == [
        "unknown: the search failed (Fault: injected into the search)"
    ]
    monkeypatch.undo()
    after = plugin.state()
    assert {k: v for k, v in after.items() if k != "not_reached"} == {
        k: v for k, v in state.items() if k != "not_reached"
    }
    assert plugin.unreached() == [
        f"{FUNCTIONAL}.gelu_and_mul in a default argument of vllm.fault_copies.gelu"
    ]
    assert copies.silu_and_mul is not None


def test_a_plugin_that_cannot_be_loaded_says_nothing_changed(site, tmp_path):
    """The entry point's one fault it cannot undo itself: the plugin's
    module does not import. It says so and that nothing was changed."""
    broken = tmp_path / "site"
    shutil.copytree(site / PACKAGE, broken / PACKAGE)
    (broken / PACKAGE / "plugin.py").write_text("raise ImportError('damaged')\n")
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import logging, sys; logging.basicConfig(level=logging.INFO);"
            f"sys.path.insert(0, {str(broken)!r}); import vllm_xpu_fakes;"
            "vllm_xpu_fakes.register(); print('started')",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.strip() == "started", done
    assert (
        "the plugin cannot be loaded (ImportError: damaged); nothing was changed"
        in done.stderr
    ), done.stderr


@pytest.mark.forked
def test_register_does_nothing_on_a_tree_make_apply_patched(site, monkeypatch):
    tree = releases.patched("0.14.1")
    libraries = _load_release(tree, "0.14.1")  # noqa: F841
    before = registering.fake_of("torch_ipex::fp8_gemm_w8a16.xpu")
    assert _owner("torch_ipex::fp8_gemm_w8a16.xpu") == "vllm._xpu_gemm_fakes"
    plugin = _plugin(site, monkeypatch)
    with _logged() as said:
        plugin.register()
    assert "patched by make apply" in plugin.state()["skipped"]
    assert len(said) == 1 and re.search(r"nothing to do \(\d+\.\d{3} s\)$", said[0])
    assert registering.fake_of("torch_ipex::fp8_gemm_w8a16.xpu") is before


# A module of vLLM's (a downstream's patched file is one too) that took
# copies of the callees before the plugin ran, and a third-party module that
# took the same.
FAULT_COPIES = """
from intel_extension_for_pytorch.llm.functional import gelu_and_mul, silu_and_mul
from vllm._C.ops import rms_norm


class Holder:
    act = silu_and_mul
    norm = rms_norm  # a built-in (pybind11): stays unbound


def gelu(x, out, kernel=gelu_and_mul):
    kernel(x, out)
"""
THIRD_PARTY = """
from intel_extension_for_pytorch.llm.functional import gelu_and_mul, silu_and_mul


class Holder:
    act = silu_and_mul


def gelu(x, out, kernel=gelu_and_mul):
    kernel(x, out)
"""


def _vllm_module(name: str, text: str) -> types.ModuleType:
    """`text` imported as the module `name` (vllm.<...>: one of vLLM's
    modules), the native extension's stand-ins (builtins) in place."""
    import importlib.util
    import tempfile

    extensions.stub_vllm_extensions()
    path = Path(tempfile.mkdtemp()) / f"{name.rpartition('.')[2]}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.forked
def test_copies_in_vllms_modules_are_rebound_and_nothing_else(site, monkeypatch):
    """`from ... import f` taken before register() in vLLM's modules (a
    module global, a class attribute) is rebound, and a call through it
    traces under fullgraph (it did not before: the negative control); a
    built-in held as a class attribute stays unbound (the negative control:
    the wrapper stored plainly breaks an instance's call). A third-party
    module's copies are left as they are. A copy in a default argument
    cannot be rebound: unreached() says so for vLLM's module, not for the
    third party's. A callee whose parameters differ from its contract is
    left alone."""
    libraries = _load_release(releases.pristine("0.14.1"), "0.14.1")
    libraries.append(ipex_standin.define_torch_ipex_ops())
    import intel_extension_for_pytorch as ipex

    copies = _vllm_module("vllm.downstream_copies", FAULT_COPIES)
    third = _vllm_module("third_party_copies", THIRD_PARTY)
    original = ipex.llm.functional.silu_and_mul
    native = copies.rms_norm

    def gelu_quick(x, out, approximate, extra):  # not the contract's (x, out)
        raise AssertionError("not called")

    ipex.llm.functional.gelu_quick = gelu_quick
    unfixed = _traced(copies.silu_and_mul)
    assert "does not support running with fake tensors" in unfixed, unfixed
    plugin_package = _plugin(site, monkeypatch)
    plugin_package.register()
    from vllm_xpu_fakes import plugin

    state = plugin.state()
    assert copies.silu_and_mul is ipex.llm.functional.silu_and_mul
    assert copies.silu_and_mul is not original
    assert copies.Holder.act is copies.silu_and_mul
    assert {
        "vllm.downstream_copies.silu_and_mul",
        "vllm.downstream_copies.rms_norm",
        "vllm.downstream_copies.Holder.act",
        "vllm.downstream_copies.Holder.norm",
    } <= set(state["copies"]), state["copies"]
    assert not any("third_party" in c for c in state["copies"]), state["copies"]
    assert third.silu_and_mul is original and third.Holder.act is original
    # the built-in stays unbound: an instance's call is the kernel's call
    assert isinstance(vars(copies.Holder)["norm"], staticmethod)
    x, w = torch.randn(3, 8), torch.ones(8)
    out, expected = torch.empty(3, 8), torch.empty(3, 8)
    assert copies.Holder().norm(out, x, w, 1e-6) is native(expected, x, w, 1e-6)
    torch.testing.assert_close(out, expected)
    copies.Holder.plain = vars(copies.Holder)["norm"].__func__  # the old way
    with pytest.raises(TypeError):
        copies.Holder().plain(out, x, w, 1e-6)
    assert plugin.unreached() == [
        "intel_extension_for_pytorch.llm.functional.gelu_and_mul in a default "
        "argument of vllm.downstream_copies.gelu"
    ]
    assert ipex.llm.functional.gelu_quick is gelu_quick
    assert any("gelu_quick does not take" in d for d in state["differs"]), state
    assert "torch.ops.vllm.ipex_silu_and_mul" in _traced(copies.silu_and_mul)


@pytest.mark.forked
def test_the_plugin_routes_an_esimd_op_whose_schema_lies(site, monkeypatch):
    """An image's ESIMD GEMM whose schema hides its write (stand-in with the
    real schema, support/esimd_standin.py), called as the ESIMD-like tree
    calls it (support/downstream.py: a re-export module, a caller that
    drops the result). Negative control: compiled (aot_eager), the kernel
    never runs and the caller gets the empty buffer. After register() the
    callee and its copies in vLLM's modules are rebound: eager is the
    original's call, compiled runs the kernel through the vLLM op of the
    contract (data/schema_contracts.toml) and equals eager."""
    from support import downstream, esimd_standin

    libraries = _load_release(releases.pristine("0.27.1"), "0.27.1")
    ran: list = []
    libraries.append(esimd_standin.define(ran))
    callee = "custom_esimd_kernels_vllm.esimd_gemm_fp8_blockscale"
    utils = "vllm.model_executor.layers.esimd_utils"
    _vllm_module(utils, downstream.ESIMD_UTILS_TEXT)
    block = _vllm_module("vllm.downstream_block", downstream.ESIMD_BLOCK_TEXT)
    args = (*esimd_standin.block_inputs(), 128, 128)

    def both():
        ran.clear()
        eager = block.apply_block_scaled_mm(*args)
        eager_ran = ran[:]
        torch._dynamo.reset()
        ran.clear()
        compiled = torch.compile(
            block.apply_block_scaled_mm, backend="aot_eager", fullgraph=True
        )(*args)
        return eager, eager_ran, compiled, ran[:]

    eager, eager_ran, compiled, compiled_ran = both()
    assert eager_ran == [esimd_standin.BLOCK_GEMM] and compiled_ran == []
    assert not torch.equal(compiled, eager)
    package = _plugin(site, monkeypatch)
    from vllm_xpu_fakes import plugin, selfcheck

    unregistered = selfcheck.Report()  # the self-check's negative control
    selfcheck.lying_ops(unregistered, plugin.state(), plugin)
    assert unregistered.failures == [
        f"custom_esimd_kernels_vllm: {callee} not rebound: compiled, what they "
        "write unmarked may be lost"
    ]
    package.register()
    state = plugin.state()
    report = selfcheck.Report()
    selfcheck.lying_ops(report, state, plugin)
    assert report.failures == []
    from xpufakes.common import ops

    known = [c for c in ops.ROUTED_CALLS if c.startswith("custom_esimd_kernels_vllm.")]
    assert report.lines == [
        (
            "custom_esimd_kernels_vllm ops whose schemas lie",
            "1 run as vLLM ops: esimd_gemm_fp8_blockscale; "
            f"{len(known) - 1} of the {len(known)} known are not in this package",
        )
    ]
    assert callee in state["rebound"], state
    assert {
        f"{utils}.esimd_gemm_fp8_blockscale",
        "vllm.downstream_block.esimd_gemm_fp8_blockscale",
    } <= set(state["copies"]), state["copies"]
    fixed, fixed_ran, compiled, compiled_ran = both()
    assert torch.equal(fixed, eager) and fixed_ran == [esimd_standin.BLOCK_GEMM]
    assert compiled_ran == [esimd_standin.BLOCK_GEMM]
    assert torch.equal(compiled, eager)


@pytest.mark.forked
def test_a_rebound_callee_returns_what_the_original_returns(site, monkeypatch):
    """Eager, every call form of a rebound callee is the original's call:
    the same return (nothing, the written argument, the tuple, a new
    tensor) and the same writes, a left-out default included (the issue's
    add_rms_norm(res, x, w, None, eps)). Compiled (aot_eager, fullgraph),
    the contract's call is the op's and returns what the original returns,
    so compiled equals eager. Negative controls: the return the plugin had
    (the op's, None) makes the compiled block fail, and a call form the
    contract does not describe stays untraceable, as it was."""
    libraries = _load_release(releases.pristine("0.14.1"), "0.14.1")
    libraries.append(ipex_standin.define_torch_ipex_ops(also_cpu=True))
    import intel_extension_for_pytorch as ipex

    functional = ipex.llm.functional
    names = ("silu_and_mul", "rms_norm", "add_rms_norm", "bgmv_shrink")
    originals = {n: getattr(functional, n) for n in names}
    x, w = torch.randn(4, 16), torch.rand(16) + 0.5
    lora = torch.randn(2, 8, 16)
    idx = torch.tensor([0, 1, 1, 0])

    def forms(f):
        """name -> (call, arguments) of each call form IPEX documents."""
        return {
            "silu_and_mul": lambda: (lambda out: (f["silu_and_mul"](x, out), out))(
                torch.zeros(4, 8)
            ),
            "silu_and_mul, out=": lambda: (
                lambda out: (f["silu_and_mul"](x, out=out), out)
            )(torch.zeros(4, 8)),
            "rms_norm": lambda: (f["rms_norm"](x, w, 1e-6), None),
            "add_rms_norm, add_back left out": lambda: (
                lambda res: (f["add_rms_norm"](res, x, w, None, 1e-6), res)
            )(torch.ones(4, 16)),
            "add_rms_norm, add_back=True": lambda: (
                lambda res: (
                    f["add_rms_norm"](res, x, w, None, 1e-6, add_back=True),
                    res,
                )
            )(torch.ones(4, 16)),
            "bgmv_shrink": lambda: (
                lambda out: (f["bgmv_shrink"](x, lora, out, idx, 0.5), out)
            )(torch.zeros(4, 8)),
            "bgmv_shrink, scaling left out": lambda: (
                lambda out: (f["bgmv_shrink"](x, lora, out, idx), out)
            )(torch.zeros(4, 8)),
        }

    def seen(result, written) -> tuple:
        """What a caller sees: the return (None, which argument, or its
        value) and the written argument's value."""
        if result is None:
            kind = None
        elif result is written:
            kind = ("the written argument", result.clone())
        else:
            kind = ("a new tensor", result.clone())
        return kind, None if written is None else written.clone()

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and torch.equal(a, b)
        if isinstance(a, tuple):
            return (
                isinstance(b, tuple)
                and len(a) == len(b)
                and all(same(p, q) for p, q in zip(a, b, strict=True))
            )
        return a == b

    before = {form: seen(*call()) for form, call in forms(originals).items()}
    plugin_package = _plugin(site, monkeypatch)
    plugin_package.register()
    from vllm_xpu_fakes import plugin

    rebound = {n: getattr(functional, n) for n in names}
    assert all(rebound[n] is not originals[n] for n in names)
    after = {form: seen(*call()) for form, call in forms(rebound).items()}
    assert [f for f in before if not same(before[f], after[f])] == []

    def block(residual):
        out = torch.empty(4, 8)
        gated = rebound["silu_and_mul"](x, out)
        normed = rebound["add_rms_norm"](residual, x, w, None, 1e-6, True)
        return gated * 2, normed + residual

    eager = block(torch.ones(4, 16))
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert same(compiled(torch.ones(4, 16)), eager)
    # the negative controls: the op's own return, and an undescribed call form
    monkeypatch.setitem(plugin.CALLEE_RETURNS, f"{FUNCTIONAL}.silu_and_mul", "")
    wrong = plugin._wrapper(
        f"{FUNCTIONAL}.silu_and_mul",
        "ipex_silu_and_mul",
        originals["silu_and_mul"],
        ("Tensor x", "Tensor out"),
    )
    torch._dynamo.reset()
    with pytest.raises(Exception, match="NoneType|unsupported operand"):
        torch.compile(
            lambda out: wrong(x, out) * 2, fullgraph=True, backend="aot_eager"
        )(torch.empty(4, 8))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="fake tensors"):
        torch.compile(
            lambda res: rebound["add_rms_norm"](res, x, w, None, 1e-6),
            fullgraph=True,
            backend="aot_eager",
        )(torch.ones(4, 16))


def _traced(silu_and_mul) -> str:
    """The graph Dynamo captures (fullgraph) of a block calling it, or the
    first line of the error that stopped the trace."""
    import torch

    captured = []

    def capture(gm, example_inputs):
        captured.append(gm.code)
        raise RuntimeError("captured")  # nothing runs: the kernels are XPU-only

    def block(x):
        out = torch.empty(x.shape[0], x.shape[1] // 2)
        silu_and_mul(x, out)
        return out * 2

    torch._dynamo.reset()
    try:
        torch.compile(block, fullgraph=True, backend=capture)(torch.randn(4, 16))
    except Exception as e:  # noqa: BLE001 - the result
        if captured:
            return captured[0]
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    raise AssertionError("the backend was not called")


# ---------------------------------------------------------------------------
# make audit with the plugin installed next to the tree's vllm/
# ---------------------------------------------------------------------------


def test_audit_reports_what_the_installed_plugin_covers(site, tmp_path):
    """An unpatched b6-like tree with the plugin installed beside its vllm/
    (as in an image's site-packages): the audit finds it, runs its
    register() in its dynamic part, and passes; the calls that fail the
    same tree without it (the pybind11 norms and rotary embedding, reached)
    are the ones it rebinds. VLLM_PLUGINS without the plugin's name and a
    compile cache older than the plugin are said."""
    from support import downstream

    root = downstream.b6_like(tmp_path / "tree")
    shutil.copytree(site / PACKAGE, root / PACKAGE)
    for info in site.glob(f"{PACKAGE}-*.dist-info"):
        shutil.copytree(info, root / info.name)
    cache = tmp_path / "vllm-cache"
    (cache / "torch_compile_cache" / "a1b2").mkdir(parents=True)
    os.utime(cache / "torch_compile_cache" / "a1b2", (1_000_000_000, 1_000_000_000))
    env = {"VLLM_PLUGINS": "other", "VLLM_CACHE_ROOT": str(cache)}
    done = tool.run("audit", str(root), "--json", env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    report = json.loads(done.stdout[done.stdout.index("{\n") :])
    assert report["ok"] is True
    plugin = report["plugin"]
    assert plugin["state"]["registered"] == ["torch_ipex::fp8_gemm_w8a16.xpu"]
    gemm = next(r for r in report["ops"] if r["op"] == "torch_ipex::fp8_gemm_w8a16")
    assert gemm["verdict"] == "ok", gemm
    reached = {f["callee"] for f in report["untraceable"] if f["reached"]}
    assert {"vllm._C.ops.rotary_embedding", "vllm._C.ops.rms_norm"} <= reached
    assert reached <= set(plugin["state"]["rebound"]), reached
    cautions = " ".join(plugin["cautions"])
    assert "VLLM_PLUGINS='other' does not name 'xpu_fakes'" in cautions
    assert "made before the plugin was installed" in cautions


def test_audit_counts_a_reached_call_as_fixed_only_if_the_plugin_rebound_it():
    """The audit's verdict on a reached call Dynamo cannot trace, with and
    without the plugin's report (the negative control: without it, or with
    a plugin that did not rebind that callee, the call fails the audit)."""
    from xpufakes.proof import audit
    from xpufakes.proof import plugin as installed_plugin

    finding = types.SimpleNamespace(
        callee="vllm._C.ops.rms_norm",
        reached=True,
        kind="a C extension's function",
        site="vllm/_ipex_ops.py:158 ipex_ops.rms_norm",
        configurations=["sp"],
        entry="RMSNorm.forward_xpu",
        note="",
        chain=["vllm/_ipex_ops.py:158 ipex_ops.rms_norm"],
    )
    installed = installed_plugin.Installed(Path("/site"), "1.0.0", 0.0)

    def result(rebound):
        state = {"registered": [], "rebound": rebound, "not_reached": []}
        plugin = None if rebound is None else audit.PluginReport(installed, state)
        return audit.Result("k", [], [finding], plugin=plugin)

    assert result(None).failing and result(["vllm._C.ops.rotary_embedding"]).failing
    fixed = result(["vllm._C.ops.rms_norm"])
    assert not fixed.failing
    lines = audit.untraceable_lines([finding], {"vllm._C.ops.rms_norm"})
    assert lines[1].startswith("vllm._C.ops.rms_norm: ok: the plugin rebinds it")
    said = "\n".join(fixed.plugin.lines())
    assert said.startswith("The vLLM plugin: vllm-xpu-fakes 1.0.0 in /site")
    assert "calls it rebinds to custom ops: vllm._C.ops.rms_norm" in said

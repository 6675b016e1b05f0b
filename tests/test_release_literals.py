"""Supporting a new release is: raise LAST, `make refresh`, `make e2e-lock`,
commit (docs/layout.md). So nothing outside the data may hold a figure of
the pins or stand for the newest pin or "newer than every pin": the docs'
ranges, counts and the newest are marked places that `make refresh` writes
(trees/pinfacts.py), the reference kernels' newest kernels release is a
value `make ops` writes (changes/opfacts.py), and code and tests compute
the newest pin, its kernels and a release newer than every pin
(tests/support/releases.py).

The checks (tests/support/literals.py, on tokens, so a re-wrapped line
hides nothing): no literal of the newest pin, of its kernels release or of
the next release written by hand outside the data; no "newest", "latest",
"only pinned" claim next to a release written by hand. A pinned release
named as a fixture (0.14.1, the IPEX era's last sdist) stays true when the
next one is pinned; a claim that it is the newest does not.

Each check has its negative control: the literals and claims that went
stale once (planted back, re-wrapped), a doc written before the newest pin,
and a fake next release pinned in memory, after which only what `make
refresh` and `make ops` write differs."""

import ast
import re
import tomllib

import pytest

from support import literals, releases
from xpufakes.changes import kernels, opfacts
from xpufakes.common import paths
from xpufakes.trees import pinfacts, pins

REFERENCE = opfacts.REFERENCE
CONTRACT = "tests/test_fakes_contract.py"


def _stale() -> tuple[str, ...]:
    """The releases no file may name by hand."""
    return (
        releases.newest(),
        releases.newest_kernels(),
        releases.newer_than_every_pin(),
    )


@pytest.fixture(scope="module")
def scanned():
    return literals.scan(_stale())


def _found(name: str, text: str) -> tuple[list[int], list[tuple]]:
    """What the scan finds in `text` as the file `name`: the lines of the
    stale releases, and the claims."""
    kept = literals.written_by_hand(name, text)
    lines = sorted(
        {
            line
            for release in _stale()
            for line in literals.literals(kept, release, name.endswith(".py"))
        }
    )
    return lines, literals.claims(kept)


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------


def test_no_file_names_the_newest_pin_its_kernels_or_the_next_release(scanned):
    found, _ = scanned
    assert found == [], (
        f"{', '.join(_stale())} written by hand (compute them: "
        f"tests/support/releases.py; docs: <!-- pins:... --> places): {found}"
    )


def test_no_newest_claim_is_written_by_hand(scanned):
    _, found = scanned
    assert found == [], (
        "a newest / only pinned claim next to a release written by hand "
        f"(compute the release, or mark it): {found}"
    )


def test_the_scan_reads_the_repository():
    """The scan covers the files that went stale once, and leaves out the
    data (a vacuous scan would pass anything)."""
    names = literals.files()
    for name in (
        "tests/test_model_trace_kernels.py",
        "tests/test_model_catalog.py",
        "tests/test_fakes_contract.py",
        "docs/testing.md",
        "docs/traced-path.md",
        REFERENCE,
        "Makefile",
    ):
        assert name in names, name
    assert not [n for n in names if n.startswith(literals.GENERATED)]
    assert "e2e/pins.toml" in names  # searched for claims, not literals


def test_the_reference_and_the_contract_test_follow_the_newest_kernels():
    """The reference kernels' NEWEST_XPU_KERNELS is the newest pin's kernels
    release, and it is what the reference and the contract test default
    to (by name: a literal there would stay when the next pin moves it)."""
    # a second reading of patches/pins.toml, not through pins.py
    pinned = tomllib.loads(paths.PINS.read_text())["releases"]
    kernels_era = [v for v, pin in pinned.items() if pin["series"][:7] == "kernels"]
    newest = max(kernels_era, key=lambda v: [int(p) for p in v.split(".")])
    want = pinned[newest]["kernels"].removeprefix("vllm-xpu-kernels ")
    assert want == releases.newest_kernels()
    reference = ast.parse((paths.REPO / REFERENCE).read_text())
    assert opfacts._assignment(reference, "NEWEST_XPU_KERNELS").value == want
    contract = ast.parse((paths.REPO / CONTRACT).read_text())
    assert _default(reference, "define_xpu_c_kernels") == "NEWEST_XPU_KERNELS"
    assert _default(contract, "_setup") == "ref.NEWEST_XPU_KERNELS"
    # the negative control: the contract test as it was
    old = ast.parse('def _setup(release: str = "0.1.15.4"):\n    pass\n')
    assert _default(old, "_setup") == "'0.1.15.4'"


def _default(tree: ast.Module, function: str) -> str:
    node = next(n for n in tree.body if getattr(n, "name", "") == function)
    return ast.unparse(node.args.defaults[0])


# ---------------------------------------------------------------------------
# Negative controls: what went stale once is found, re-wrapped or not, and
# what is computed is not
# ---------------------------------------------------------------------------


def test_the_scan_finds_the_literals_and_claims_that_went_stale():
    newest, kernels_release, newer = _stale()
    previous = pins.load().ordered()[-2].version
    major, minor, patch = pins.load().newest().release
    planted = {
        # test_model_trace_kernels.py when the pin after it came
        ("tests/x.py", f'NEWEST = "{previous}"\n'): ([], ["newest"]),
        ("tests/x.py", f'NEWEST = "{newest}"\n'): ([1], ["newest"]),
        # test_model_catalog.py's docstring, re-wrapped
        (
            "tests/x.py",
            f'"""\n* {previous}, the\n  newest pin: unpatched and patched"""\n',
        ): ([], ["newest"]),
        # docs/testing.md, re-wrapped in a paragraph
        (
            "docs/x.md",
            f"and MLA\n(`deepseek_v2_fp8` on {previous}, the only\n"
            "pinned tree that runs it on XPU), each\n",
        ): ([], ["only pinned"]),
        # a comment re-wrapped, `#` between the words
        ("tests/x.py", f"# {previous} is the\n# latest pin\nX = 1\n"): (
            [],
            ["latest"],
        ),
        # test_fakes_contract.py's default, had it been written the day
        # the newest pin came
        ("tests/x.py", f'def _setup(release: str = "{kernels_release}"):\n'): (
            [1],
            [],
        ),
        ("tests/x.py", f"LAST = ({major}, {minor}, {patch})\n"): ([1], []),
        ("tests/x.py", f"LAST = ({major},\n    {minor}, {patch})\n"): ([1], []),
        # docs/releases.md's example, with the next release by hand
        ("docs/x.md", f"above the newest pin ({newer} on the day it ships)\n"): (
            [1],
            ["newest"],
        ),
    }
    for (name, text), (lines, claimed) in planted.items():
        found_lines, found_claims = _found(name, text)
        assert found_lines == lines, (text, found_lines)
        assert [c for _, c, _ in found_claims] == claimed, (text, found_claims)


def test_what_is_computed_or_cited_is_not_found_and_its_copy_is():
    newest, kernels_release, _ = _stale()
    previous = pins.load().ordered()[-2].version
    major, minor, patch = pins.load().newest().release
    marked = f"the newest pin (<!-- pins:newest -->{newest}<!-- /pins -->)\n"
    assert _found("docs/x.md", marked) == ([], [])
    assert _found("docs/x.md", pinfacts.MARKED.sub(newest, marked)) == (
        [1],
        [(1, "newest", newest)],
    )
    # the nearest release decides: a release of another item before a
    # computed one is no claim; alone, it is
    listed = f"(`x` on {previous}, `y` on the newest pin"
    assert _found(
        "docs/x.md", listed + f", <!-- pins:newest -->{newest}<!-- /pins -->)\n"
    ) == ([], [])
    assert _found("docs/x.md", listed + ")\n")[1] == [(1, "newest", previous)]
    # a value `make ops` writes, in the file it writes it in
    generated = f'NEWEST_XPU_KERNELS = "{kernels_release}"\n'
    assert _found(REFERENCE, generated) == ([], [])
    assert _found("tests/x.py", generated)[0] == [1]
    # make refresh's input
    last = f"FIRST, LAST = (0, 10, 0), ({major}, {minor}, {patch})\n"
    assert _found("scripts/xpufakes/changes/authoring.py", last) == ([], [])
    assert _found("scripts/xpufakes/changes/other.py", last)[0] == [1]
    # a citation of a release's own source, re-wrapped or not
    for cited in (
        f"vLLM {newest} `vllm/x.py:12`: the call\n",
        f"vLLM\n{newest}\n`vllm/x.py:12`: the call\n",
    ):
        assert _found("docs/x.md", cited) == ([], [])
    assert _found("docs/x.md", f"vLLM {newest} (`vllm/x.py`): the call\n")[0] == [1]
    # a call that computes the newest, a name in backticks, another statement
    computed = f'EXAMPLES = ("{previous}", newest())\n'
    assert _found("tests/x.py", computed) == ([], [])
    assert _found("tests/x.py", computed.replace("newest()", "NEWEST"))[1] != []
    assert _found("docs/x.md", f"`v{previous}`, over `latest`\n") == ([], [])
    assert _found("docs/x.md", f"`v{previous}`, over latest\n")[1] != []
    statements = f'X = "{previous}"\nNEWEST = releases.newest()\n'
    assert _found("tests/x.py", statements) == ([], [])
    trailing = statements.replace("\n", "  # the newest pin\n", 1)
    assert _found("tests/x.py", trailing)[1] == [(1, "newest", previous)]
    above = f'X = "{previous}"\n# the newest pin:\nNEWEST = releases.newest()\n'
    assert _found("tests/x.py", above) == ([], [])
    # not inside a longer release
    assert _found("tests/x.py", f'OTHER = "1{newest}.1"\n') == ([], [])


# ---------------------------------------------------------------------------
# The docs' figures of the pins
# ---------------------------------------------------------------------------


def test_the_docs_figures_are_the_pins():
    for name in pinfacts.DOCUMENTS:
        text = (paths.REPO / name).read_text()
        assert pinfacts.rewrite(text, pinfacts.facts()) == text, (
            f"{name}: a marked place disagrees with patches/pins.toml "
            "(`make refresh` writes them)"
        )
    readme = (paths.REPO / "README.md").read_text()
    marked = {m.group(1) for m in pinfacts.MARKED.finditer(readme)}
    assert {"range", "ipex", "kernels", "count", "newest"} <= marked
    notes = (paths.REPO / "docs" / "releases.md").read_text()
    marked = {m.group(1) for m in pinfacts.MARKED.finditer(notes)}
    assert {"first", "newest", "next", "count_short", "series_table"} <= marked
    testing = (paths.REPO / "docs" / "testing.md").read_text()
    assert "newest" in {m.group(1) for m in pinfacts.MARKED.finditer(testing)}
    # outside the marked places, no count of the pins
    for text in (readme, notes):
        outside = pinfacts.MARKED.sub("", text)
        assert not re.search(r"\b\d+ releases", outside), outside


def test_a_doc_written_before_a_new_pin_is_stale():
    """Negative control: the docs as they were before the newest release was
    pinned (the facts of the pins without it) fail the check above."""
    loaded = pins.load()
    before = pins.Pins(
        {v: p for v, p in loaded.releases.items() if v != releases.newest()}
    )
    for name in pinfacts.DOCUMENTS:
        current = (paths.REPO / name).read_text()
        old = pinfacts.rewrite(current, pinfacts.facts(before))
        assert old != current
        assert pinfacts.rewrite(old, pinfacts.facts()) == current


def test_newer_than_every_pin_is_no_pin():
    newer = releases.newer_than_every_pin()
    assert newer not in pins.load().releases
    assert pins.version_tuple(newer) > pins.load().ordered()[-1].release


# ---------------------------------------------------------------------------
# A fake next release: nothing but make refresh (and make ops) changes
# ---------------------------------------------------------------------------


def _bumped(release: str) -> str:
    *head, last = release.split(".")
    return ".".join([*head, str(int(last) + 1)])


def test_a_fake_next_release_needs_nothing_but_make_refresh(monkeypatch):
    """Pin a release newer than every pin (with a newer kernels release) in
    memory, and every check that reads the newest pin follows it: the
    files that disagree are only the places `make refresh` and `make ops`
    write, and once those are written in memory, every check here passes
    and the rest of each file is as it was."""
    real = pins.load()
    old_newest, old_kernels = real.newest(), real.newest_kernels()
    fake_version, fake_kernels = real.next_release(), _bumped(old_kernels)
    fake = pins.Pins(
        {
            **real.releases,
            fake_version: pins.Pin(
                fake_version,
                "0" * 64,
                series=old_newest.series,
                kernels=f"{kernels.XPU_KERNELS} {fake_kernels}",
                files=old_newest.files,
            ),
        }
    )
    names = literals.files()
    before = {n: (paths.REPO / n).read_text(errors="replace") for n in names}
    real_facts = pinfacts.facts()
    real_generated = opfacts.expected(paths.REPO)
    monkeypatch.setattr(pins, "load", lambda: fake)

    # every computation of the newest pin follows it
    assert releases.newest() == fake_version
    newer = releases.newer_than_every_pin()
    assert pins.version_tuple(newer) > pins.version_tuple(fake_version)
    assert releases.newest_kernels() == fake_kernels
    assert kernels.newest_xpu_kernels() == fake_kernels
    assert fake_version in releases.representative()
    assert releases.era_examples()[-1] == fake_version
    assert opfacts.python_values()[REFERENCE]["NEWEST_XPU_KERNELS"] == fake_kernels
    assert pinfacts.facts()["newest"] == fake_version

    # make refresh's writers, in memory
    after = dict(before)
    for name in pinfacts.DOCUMENTS:
        after[name] = pinfacts.rewrite(after[name], pinfacts.facts())
    for name, rewrite in opfacts.expected(paths.REPO).items():
        after[name] = rewrite(after[name])
    changed = {n for n in names if after[n] != before[n]}
    assert changed == set(pinfacts.DOCUMENTS) | {REFERENCE}, changed

    # what changed is the generated places only: the real pins' writers
    # give back the files as they were
    for name in changed:
        restored = after[name]
        if name in pinfacts.DOCUMENTS:
            restored = pinfacts.rewrite(restored, real_facts)
        if name in real_generated:
            restored = real_generated[name](restored)
        assert restored == before[name], name

    # before refresh the docs' check fails; after it, every check passes
    for name in pinfacts.DOCUMENTS:
        assert pinfacts.rewrite(before[name], pinfacts.facts()) != before[name]
        assert pinfacts.rewrite(after[name], pinfacts.facts()) == after[name]
    for name, rewrite in opfacts.expected(paths.REPO).items():
        assert rewrite(after[name]) == after[name], name
    # and nothing written by hand names the new newest pin or the old one
    # (which refresh moved in the marked places and the reference only)
    stale = (fake_version, fake_kernels, newer, old_newest.version, old_kernels)
    assert literals.scan(stale, read=after.__getitem__) == ([], [])

"""Which llm-scaler image a vLLM tree is (trees/images.py, data/images.toml
written by `make images`, changes/imagefacts.py), and what follows from it:
the audit names it, and the ESIMD facts of schema truth are the image's
(schematruth.choose_commit), not the newest image of the tree's release.

The image tree here is llm-scaler 0.21.0-b3.1 (25095b4), rebuilt from
../shared's public inputs (tests/support/images.py: skipped without them,
failed under CI); b3.1 and b18beee both build vLLM 0.21.0, so the release
alone cannot tell them apart. The five other images' trees are checked in
the opt-in tests/test_llm_scaler_trees.py."""

import json
import subprocess
from pathlib import Path

import pytest

from support import images as shared
from support import releases, tool
from xpufakes.changes import esimdfacts, imagefacts
from xpufakes.common.errors import Refusal
from xpufakes.proof import audit
from xpufakes.proof.model import limits
from xpufakes.proof.static import schematruth
from xpufakes.proof.xpu import esimd
from xpufakes.trees import images
from xpufakes.trees import tree as xtree

B31 = "25095b4"
B18 = "b18beee"


@pytest.fixture(scope="module")
def b31() -> Path:
    shared.need(shared.B31)
    return shared.b31_cached()


def test_the_b31_tree_is_b31(b31):
    found = images.recognise(b31)
    assert found.exact and found.image == B31, found.describe()
    assert found.name == "llm-scaler 0.21.0-b3.1" and found.vllm == "0.21.0"
    assert found.files == 110 and found.known == len(images.load()) == 6
    # b18beee builds the same release and shares most of b3.1's files: not it
    data = images.load()
    b18 = images.recognise(b31, {B18: data[B18]})
    assert b18.modified and len(b18.differ) == 16, b18.describe()
    # negative control: one of b3.1's ids changed in the data, the tree is
    # no longer b3.1 itself
    wrong = {B31: dict(data[B31], files=dict(data[B31]["files"]))}
    path = next(iter(wrong[B31]["files"]))
    wrong[B31]["files"][path] = "0123456789"
    found = images.recognise(b31, wrong)
    assert found.modified and found.differ == (path,), found.describe()


def test_the_data_is_the_shared_patchs(b31):
    """b3.1's entry is the public patch's (the same blob, its post-image
    ids), and `git hash-object` agrees with the ids recognise computes."""
    patch = shared.vllm_patch(shared.B31)
    entry = images.load()[B31]
    assert entry["patch_blob"] == images.blob_id(patch)
    assert entry["patch_blob"].startswith("e98f898f")  # shared/.../README.md
    assert imagefacts.post_images(patch.decode()) == entry["files"]
    some = sorted(entry["files"])[:5]
    hashed = subprocess.run(
        ["git", "hash-object", *some], cwd=b31, capture_output=True, text=True
    ).stdout.split()
    assert hashed == [images.blob_id((b31 / p).read_bytes()) for p in some]
    assert all(
        h.startswith(entry["files"][p]) for p, h in zip(some, hashed, strict=True)
    )


def test_the_pristine_release_is_no_image(b31):
    pristine = releases.pristine(shared.B31_RELEASE)
    found = images.recognise(pristine)
    assert found.image is None and not found.modified, found.describe()
    said = audit.image_line(found, "0.21.0")
    assert "not one of the 6 images" in said and "assumed: vLLM 0.21.0" in said
    # the control: the same files, the image's patch applied, are the image
    assert images.recognise(b31).exact


def test_a_changed_file_makes_a_modified_b31(b31, tmp_path):
    tree = shared.b31_copy(tmp_path / "t")
    changed = "vllm/_xpu_ops.py"
    assert changed in images.load()[B31]["files"]
    assert images.recognise(tree).exact  # the control: the copy as it is
    with (tree / changed).open("a") as f:
        f.write("# a local edit\n")
    found = images.recognise(tree)
    assert found.image == B31 and not found.exact and found.differ == (changed,)
    assert found.describe().startswith("a modified llm-scaler 0.21.0-b3.1")
    assert "1 of the 110 files" in found.describe()
    line = audit.image_line(found, "0.21.0")
    assert line.endswith("taken as that image"), line
    # a modified image keeps its ESIMD facts
    short, said = schematruth.choose_commit(esimdfacts.load(), "0.21.0", found)
    assert short == B31 and "a modified llm-scaler 0.21.0-b3.1" in said


def test_the_esimd_facts_are_the_recognised_images():
    commits = esimdfacts.load()
    assert {B18, B31} <= set(commits)
    assert commits[B18]["vllm"] == commits[B31]["vllm"] == "0.21.0"
    for short in (B18, B31):
        chosen, said = schematruth.choose_commit(
            commits, "0.21.0", images.as_image(short)
        )
        assert chosen == short and "data/images.toml" in said, said
    # negative controls: no image, or one whose package the data lacks
    # (b6 builds 0.10.2, before the package): today's rule, said so
    by_release = max(
        (c for c in commits if commits[c]["vllm"] == "0.21.0"),
        key=lambda c: commits[c]["date"],
    )
    assert by_release == B31
    chosen, said = schematruth.choose_commit(commits, "0.21.0", None)
    assert chosen == B31 and "builds vLLM 0.21.0" in said
    unknown = images.Recognition(None, known=6)
    chosen, said = schematruth.choose_commit(commits, "0.21.0", unknown)
    assert chosen == B31 and said.startswith("the tree is no image"), said
    b6 = images.as_image("b5571c3")
    chosen, said = schematruth.choose_commit(commits, "0.21.0", b6)
    assert chosen == B31 and "whose package the data lacks" in said, said
    # the facts themselves: b18beee's ops cited from b18beee
    package = {"": schematruth.ESIMD_PACKAGE}
    for short in (B18, B31):
        facts, _, sources, warnings = schematruth.kernel_facts(
            package, "0.21.0", image=images.as_image(short)
        )
        assert sources[1].startswith(f"data/esimd_schemas.toml: llm-scaler {short}")
        gemm = facts["custom_esimd_kernels_vllm::esimd_gemm_fp8_blockscale"]
        assert gemm.where.startswith(f"llm-scaler {short} ")
        assert not warnings


def test_a_tree_recognised_as_b18beee_takes_b18beees_facts(tmp_path, monkeypatch):
    """A small tree whose files carry the ids b18beee's entry names (the
    entry's files made from the tree: the real ids are b18beee's only on its
    real tree, tests/test_llm_scaler_trees.py) is recognised as b18beee,
    and schema truth, the ESIMD stand-ins and the limits take b18beee's
    commit, not the last image of the data built on that release (b3.1)."""
    root = tmp_path / "t"
    (root / "vllm").mkdir(parents=True)
    files = {f"vllm/{n}.py": f"{n} = 1\n".encode() for n in "abc"}
    for path, data in files.items():
        (root / path).write_bytes(data)
    entries = images.load()
    entries[B18]["files"] = {p: images.blob_id(d)[:9] for p, d in files.items()}
    data = tmp_path / "images.toml"
    data.write_text(imagefacts.render(entries))
    monkeypatch.setattr(images, "DATA", data)
    texts = {"vllm/x.py": "import custom_esimd_kernels_vllm"}
    found = images.recognise(root)
    assert found.exact and found.image == B18
    assert schematruth.choose_commit(esimdfacts.load(), "0.21.0", found)[0] == B18
    assert esimd.commit_for("0.21.0", root)[0] == B18
    assert limits.image_of(texts, "0.21.0", root) == B18
    # one file changed: a modified b18beee, still its facts
    (root / "vllm/c.py").write_bytes(b"c = 2\n")
    found = images.recognise(root)
    assert found.modified and found.differ == ("vllm/c.py",), found.describe()
    assert esimd.commit_for("0.21.0", root)[0] == B18
    # negative control: two of three changed, no image (not more than half
    # match): today's rule, the newest image of the release
    (root / "vllm/b.py").write_bytes(b"b = 2\n")
    found = images.recognise(root)
    assert found.image is None and found.nearest_matched == 1, found.describe()
    assert esimd.commit_for("0.21.0", root)[0] == B31
    assert limits.image_of(texts, "0.21.0", root) == B31


def test_the_stand_ins_and_limits_take_b31s_commit(b31):
    texts = {"vllm/x.py": "import custom_esimd_kernels_vllm"}
    assert esimd.commit_for("0.21.0", b31)[0] == B31
    assert limits.image_of(texts, "0.21.0", b31) == B31
    assert limits.image_of({}, "0.21.0", b31) == ""  # the tree names no package


def test_the_audit_of_b31_names_it_and_reads_25095b4s_facts(b31):
    """One static audit of the b3.1 tree, in this process: its line and
    its JSON name the image, and schema truth reads 25095b4's package."""
    found = xtree.locate(str(b31))
    result = audit.audit(found, dynamic=False)
    text = audit.table(found, result)
    line = text.splitlines()[1]
    assert line.startswith("Image: llm-scaler 0.21.0-b3.1 (llm-scaler 25095b4"), line
    report = json.loads(audit.to_json(found, result))
    assert report["image"]["image"] == B31 and report["image"]["exact"]
    source = report["schema_truth"]["sources"][1]
    assert source.startswith(f"data/esimd_schemas.toml: llm-scaler {B31} "), source
    assert "the tree is llm-scaler 0.21.0-b3.1" in source
    cited = {o["schema_from"] for o in report["schema_truth"]["ops"]}
    esimd_cited = {c for c in cited if c.startswith("llm-scaler ")}
    assert esimd_cited and all(c.startswith(f"llm-scaler {B31} ") for c in esimd_cited)


def test_make_images_keeps_an_image_the_git_dir_lacks(tmp_path):
    """The writer reads the image commits the git dir holds and keeps the
    others as the data had them; a new image needs its tag."""
    repo = tmp_path / "repo"
    env = tool.git_env("images")
    patch = (
        "diff --git a/vllm/x.py b/vllm/x.py\n"
        "index 1111111..2222222 100644\n--- a/vllm/x.py\n+++ b/vllm/x.py\n"
        "@@ -1 +1 @@\n-a\n+b\n"
        "diff --git a/vllm/gone.py b/vllm/gone.py\n"
        "deleted file mode 100644\nindex 3333333..0000000\n"
        "diff --git a/setup.py b/setup.py\nindex 4444444..5555555 100644\n"
        "diff --git a/vllm/run.sh b/vllm/run.sh\nold mode 100644\nnew mode 100755\n"
    )
    (repo / "vllm/patches").mkdir(parents=True)
    (repo / "vllm/docker").mkdir(parents=True)
    (repo / imagefacts.PATCH).write_text(patch)
    (repo / "vllm/docker/Dockerfile").write_text(
        "RUN git clone -b v9.9.9 https://github.com/vllm-project/vllm.git\n"
    )
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "i"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True
    ).stdout.strip()
    data = tmp_path / "images.toml"
    data.write_text(imagefacts.render({B31: images.load()[B31]}))
    with pytest.raises(Refusal, match="needs its tag"):
        imagefacts.write(repo / ".git", [head[:7]], data)
    path, read, kept = imagefacts.write(repo / ".git", [f"{head[:7]}=9.9.9-t"], data)
    assert read == [head[:7]] and kept == [B31]
    written = images.load(path)
    assert written[B31] == images.load()[B31]
    new = written[head[:7]]
    assert new["name"] == "llm-scaler 9.9.9-t" and new["vllm"] == "9.9.9"
    assert new["files"] == {"vllm/gone.py": "0000000", "vllm/x.py": "2222222"}
    # again, without a tag: the name is kept
    imagefacts.write(repo / ".git", [head[:7]], data)
    assert images.load(data)[head[:7]]["name"] == "llm-scaler 9.9.9-t"

"""`make images GIT=<intel/llm-scaler git dir> [COMMITS="<commit>=<tag> ..."]`:
the maintainers' command that writes data/images.toml, what
trees/images.py recognises a tree by: per llm-scaler image commit, its name
("llm-scaler <tag>", given once; kept after), the vLLM release its
Dockerfile builds, and the post-image git blob id of every file under vllm/
its vLLM patch (vllm/patches/vllm_for_multi_arc.patch) changes, from the
patch's `index <pre>..<post>` lines. Git only, from the directory given: the
data is committed. An image already in the data that the git dir lacks is
kept as it is (and said): intel/llm-scaler and a fork hold different
commits."""

import re
import tomllib
from pathlib import Path

from xpufakes.changes import esimdfacts
from xpufakes.common.errors import Refusal
from xpufakes.trees import images

PATCH = "vllm/patches/vllm_for_multi_arc.patch"
_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_INDEX = re.compile(r"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: \d+)?$")


def post_images(patch: str, under: str = "vllm/") -> dict[str, str]:
    """path -> the blob id (as abbreviated as the patch gives it) each file
    under `under` has after the patch; a deleted file's is all zeros."""
    found, path = {}, None
    for line in patch.splitlines():
        header = _DIFF.match(line)
        if header:
            path = header.group(2)
            continue
        index = _INDEX.match(line)
        if index and path is not None:
            if path.startswith(under):
                found[path] = index.group(2)
            path = None
    return dict(sorted(found.items()))


def read(git_dir: Path, commit: str, name: str) -> dict:
    """The image's entry at an llm-scaler commit."""
    git = esimdfacts._git
    full = git(git_dir, "rev-parse", f"{commit}^{{commit}}").strip()
    patch = git(git_dir, "show", f"{full}:{PATCH}")
    files = post_images(patch)
    if not files:
        raise Refusal(f"{commit}: {PATCH} changes no file under vllm/")
    release = esimdfacts._release(git_dir, full)
    if not release:
        raise Refusal(
            f"{commit}: no `git clone -b v<release>` of vLLM in its Dockerfile"
        )
    return {
        "name": name,
        "commit": full,
        "date": git(git_dir, "show", "-s", "--format=%cs", full).strip(),
        **release,
        "patch": PATCH,
        "patch_blob": git(git_dir, "rev-parse", f"{full}:{PATCH}").strip(),
        "files": files,
    }


def _has(git_dir: Path, commit: str) -> bool:
    try:
        esimdfacts._git(git_dir, "rev-parse", "--verify", "-q", f"{commit}^{{commit}}")
    except Refusal:
        return False
    return True


HEADER = """\
# The downstream images `make audit` recognises a vLLM tree as
# (trees/images.py): per intel/llm-scaler image commit, its name, the vLLM
# release its vllm/docker/Dockerfile builds (vllm_from), its vLLM patch
# (path, git blob) and, under [<commit>.files], the git blob id of each file
# under vllm/ the patch leaves (its `index <pre>..<post>` lines, abbreviated
# as there). A tree whose files all carry an image's ids is that image;
# more than half, a modified one.
#
# Written by `make images GIT=<an intel/llm-scaler git dir>
# [COMMITS="<commit>=<tag> ..."]` (changes/imagefacts.py) from the commits
# already here and those given (name: "llm-scaler <tag>"); do not edit by
# hand.
"""


def render(entries: dict[str, dict]) -> str:
    value = esimdfacts._value
    lines = [HEADER]
    for short, entry in entries.items():
        lines.append(f"[{short}]")
        for key in ("name", "commit", "date", "vllm", "vllm_from", "patch"):
            lines.append(f"{key} = {value(entry[key])}")
        lines.append(f"patch_blob = {value(entry['patch_blob'])}")
        lines.append("")
        lines.append(f"[{short}.files]")
        lines += [f"{value(p)} = {value(b)}" for p, b in entry["files"].items()]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write(
    git_dir: Path, commits: list[str], path: Path | None = None
) -> tuple[Path, list[str], list[str]]:
    """Regenerate the data from `git_dir`: the images it holds and those
    given ("<commit>=<tag>"; a short hash of 7 names each). Returns the
    file, the images read, the images kept as they were (not in the dir)."""
    if not Path(git_dir).is_dir():
        raise Refusal(f"{git_dir}: not a directory (give an intel/llm-scaler git dir)")
    path = path or images.DATA
    existing = images.load(path)
    names = {short: entry["name"] for short, entry in existing.items()}
    for given in commits:
        commit, _, tag = given.partition("=")
        if not tag:
            name = names.get(commit[:7])
            if name is None:
                raise Refusal(f"{commit}: a new image needs its tag ({commit}=<tag>)")
            tag = name.removeprefix("llm-scaler ")
        names[commit[:7]] = f"llm-scaler {tag}"
    given_commits = {c.partition("=")[0][:7] for c in commits}
    found, kept = {}, []
    for short, name in names.items():
        if short not in given_commits and not _has(git_dir, short):
            found[short] = existing[short]
            kept.append(short)
            continue
        entry = read(Path(git_dir), short, name)
        found[entry["commit"][:7]] = entry
    found = dict(sorted(found.items(), key=lambda item: item[1]["date"]))
    text = render(found)
    tomllib.loads(text)  # it reads back
    path.write_text(text)
    return path, [s for s in found if s not in kept], kept

"""Run a vLLM tree's own pre-commit checks on given files, offline.

The hooks come from the tree's `.pre-commit-config.yaml`: ruff check and
ruff format at the ruff release the tree pins, typos at its pinned release,
the tree's `tools/pre_commit/*.py` checks (forbidden imports, SPDX headers,
test tethering, ...), its `language: system` hooks, and mypy through the
tree's `tools/pre_commit/mypy.py` with the mypy release and plugins the hook
lists. Their tools are installed once (common/installer.py: uv, or pip) into
a virtual environment in the cache, keyed by those releases. A hook that
needs the network or a tool that is not a Python package (clang-format,
markdownlint, shellcheck, actionlint, cargo) runs only if one of the files
is of its kind, and is then reported as not run, with the reason.

Given the tree as it was before the change (`before`), each finding of a
failing ruff says whose it is: "in lines this change adds", "already in the
tree before this change", or, for one in a line the change leaves as it was
that the tree did not have (an import the change left unused), "caused by
this change in a line it does not change"; a file ruff format would change
says whether it was formatted before. Child processes run through
children.py, so that a signal `stage` holds stops them.
"""

import hashlib
import json
import os
import re
import shlex
import sys
import venv
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from xpufakes.common import children, installer, paths
from xpufakes.common.errors import Refusal

CONFIG = ".pre-commit-config.yaml"
PASSED, FAILED, SKIPPED = "passed", "FAILED", "not run"
# Hooks of remote repositories this module runs itself (by pre-commit id).
RUFF_HOOKS = ("ruff-check", "ruff", "ruff-format")
LOCAL_LANGUAGES = ("python", "system", "script")
# What the remote hooks' own .pre-commit-hooks.yaml select (the config
# only overrides it).
REMOTE_DEFAULTS = {
    "markdownlint-cli2": {"types": ["markdown"]},
    "markdownlint": {"types": ["markdown"]},
    "actionlint": {"files": r"^\.github/workflows/"},
    "shellcheck": {"types": ["shell"]},
    "clang-format": {"types_or": ["c++", "cuda"]},
    "check-json": {"types": ["json"]},
    "pip-compile": {"files": r"^requirements\.(in|txt)$"},
    "ruff-check": {"types_or": ["python", "pyi"]},
    "ruff": {"types_or": ["python", "pyi"]},
    "ruff-format": {"types_or": ["python", "pyi"]},
}


@dataclass
class Result:
    hook: str
    status: str  # PASSED, FAILED or SKIPPED
    command: str = ""
    output: str = ""

    def line(self) -> str:
        if self.status == PASSED or not self.output.strip():
            return f"  {self.hook}: {self.status}"
        lines = self.output.strip().splitlines()
        telling = [ln for ln in lines if re.search(r"error|Found \d|fail", ln, re.I)]
        return f"  {self.hook}: {self.status} ({(telling or lines)[-1].strip()})"


def _pin(config: str, pattern: str) -> str | None:
    match = re.search(pattern, config)
    return match.group(1) if match else None


def tool_requirements(config: str) -> list[str]:
    """What the checks need from PyPI, at the releases the config pins."""
    # the release, or a commit with the release in pre-commit's "frozen"
    # comment (`rev: <commit>  # frozen: v<release>`, as later trees write it)
    ruff = _pin(
        config,
        r"astral-sh/ruff-pre-commit\s*\n\s*rev:\s*(?:[0-9a-f]{40}\s*#\s*frozen:\s*)?v?([\w.]+)",
    )
    if not ruff:
        raise Refusal(f"{CONFIG} pins no ruff release (astral-sh/ruff-pre-commit)")
    if re.fullmatch(r"[0-9a-f]{40}", ruff):
        raise Refusal(
            f"{CONFIG} pins ruff by commit ({ruff}) and does not say its release "
            "(no '# frozen: v...' comment); cannot install it"
        )
    wanted = [f"ruff=={ruff}", "regex", "PyYAML"]
    mypy_deps = _MYPY_DEPS.search(config)
    if mypy_deps:
        wanted += [
            d.strip("\"'") for d in _FLOW_ITEM.findall(mypy_deps.group(1)) if d.strip()
        ]
    return list(dict.fromkeys(wanted))


# the mypy hook's additional_dependencies, a YAML flow sequence whose items
# may hold brackets ("mypy[faster-cache]==1.19.1", 0.21.0's), quoted or not
_MYPY_DEPS = re.compile(
    r"id: mypy\b.*?additional_dependencies:\s*"
    r"""\[((?:"[^"]*"|'[^']*'|[^\]"'\[]|\[[^\]]*\])*)\]""",
    re.S,
)
_FLOW_ITEM = re.compile(r"""\s*("[^"]*"|'[^']*'|[^,]+?)\s*(?:,|$)""")


def _environment(config: str) -> Path:
    """The cached virtual environment with the checks' tools."""
    wanted = tool_requirements(config)
    key = hashlib.sha256("\n".join(wanted).encode()).hexdigest()[:12]
    ruff = wanted[0].split("==")[1]
    home = paths.cache_dir() / "checks" / f"ruff-{ruff}-{key}"
    if (home / ".installed").is_file():
        return home
    with paths.cache_lock(f"checks-{home.name}"):
        return _install(home, wanted)


def _install(home: Path, wanted: list[str]) -> Path:
    python = home / "bin" / "python"
    if (home / ".installed").is_file():
        return home  # made by another process meanwhile
    if not python.exists():
        venv.create(home, with_pip=True)
    command, env = installer.command(python, wanted, quiet=True, say=_quiet)
    result = children.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["the installer failed"])[-1]
        raise Refusal(
            f"cannot install the tree's check tools ({' '.join(wanted)}): {last}"
        )
    (home / ".installed").write_text("\n".join(wanted) + "\n")
    return home


def _quiet(line: str) -> None:
    """The installer's own lines (setting up uv): not part of the report."""


def _typos(home: Path, config: str) -> Path | None:
    """typos at the pinned release, if it can be installed (None if not)."""
    release = _pin(config, r"crate-ci/typos\s*\n\s*rev:\s*v?([\w.]+)")
    if not release:
        return None
    marker = home / f".typos-{release}"
    binary = home / "bin" / "typos"
    if marker.is_file():
        return binary if binary.exists() else None
    with paths.cache_lock(f"checks-{home.name}"):
        if not marker.is_file():
            _install_typos(home, release, marker)
    return binary if binary.exists() else None


def _install_typos(home: Path, release: str, marker: Path) -> None:
    python = home / "bin" / "python"
    command, env = installer.command(
        python, [f"typos=={release}"], quiet=True, say=_quiet
    )
    children.run(command, capture_output=True, env=env)
    marker.write_text("")


def _hooks(home: Path, root: Path) -> list[dict]:
    """Every hook of the config, with its repo's URL under "repo"."""
    script = (
        "import json, sys, yaml\n"
        "config = yaml.safe_load(open(sys.argv[1]))\n"
        "hooks = []\n"
        "for repo in config.get('repos', []):\n"
        "    for hook in repo.get('hooks', []):\n"
        "        hooks.append(dict(hook, repo=repo['repo']))\n"
        "print(json.dumps({'hooks': hooks, 'exclude': config.get('exclude', '^$'),"
        " 'stages': config.get('default_stages')}))\n"
    )
    out = children.run(
        [str(home / "bin" / "python"), "-c", script, str(root / CONFIG)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data = json.loads(out)
    hooks = []
    for hook in data["hooks"]:
        if hook["repo"] != "local":
            hook = {**REMOTE_DEFAULTS.get(hook["id"], {}), **hook}
        hook["_global_exclude"] = data["exclude"]
        hooks.append(hook)
    return hooks


_EXTENSIONS = {
    "python": (".py",),
    "pyi": (".pyi",),
    "yaml": (".yaml", ".yml"),
    "markdown": (".md",),
    "shell": (".sh",),
    "png": (".png",),
    "rust": (".rs",),
    "proto": (".proto",),
    "c++": (".cpp", ".cc", ".h", ".hpp"),
    "cuda": (".cu", ".cuh"),
    "json": (".json",),
}


def _of_type(path: str, types: list[str]) -> bool:
    def one(kind: str) -> bool:
        if kind in ("file", "text"):
            return True
        return path.endswith(_EXTENSIONS.get(kind, ("\0",)))

    return all(one(k) for k in types)


def selected(hook: dict, files: list[str]) -> list[str]:
    """The files pre-commit would pass to the hook."""
    chosen = []
    for path in files:
        if re.search(hook.get("_global_exclude", "^$"), path):
            continue
        if not re.search(hook.get("files", ""), path):
            continue
        if hook.get("exclude") and re.search(hook["exclude"], path):
            continue
        if hook.get("types") and not _of_type(path, hook["types"]):
            continue
        types_or = hook.get("types_or")
        if types_or and not any(_of_type(path, [k]) for k in types_or):
            continue
        chosen.append(path)
    return chosen


def _run(name: str, command: list[str], root: Path, env: dict) -> Result:
    result = children.run(command, cwd=root, env=env, capture_output=True, text=True)
    shown = " ".join(shlex.quote(c) for c in command)
    output = (result.stdout + result.stderr).strip()
    return Result(name, PASSED if result.returncode == 0 else FAILED, shown, output)


def formatter(root: Path) -> Callable[[str], str]:
    """Format Python source as the tree's ruff format does for vllm/ files
    (its pinned ruff, its configuration)."""
    if not (root / CONFIG).is_file():
        raise Refusal(f"{root} has no {CONFIG}; cannot format as the tree does")
    ruff = str(_environment((root / CONFIG).read_text()) / "bin" / "ruff")

    def format_text(text: str) -> str:
        done = children.run(
            [ruff, "format", "--stdin-filename", "vllm/_xpu_ops.py", "-"],
            input=text,
            cwd=root,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise Refusal(f"the tree's ruff cannot format: {done.stderr.strip()}")
        return done.stdout

    return format_text


def run(root: Path, files: list[str], before: Path | None = None) -> list[Result]:
    """Run the tree's offline pre-commit hooks on `files` (relative to root);
    `before`: the tree before the change (says whose ruff's findings are)."""
    if not (root / CONFIG).is_file():
        raise Refusal(f"{root} has no {CONFIG}; cannot run the tree's own checks")
    config = (root / CONFIG).read_text()
    home = _environment(config)
    python = str(home / "bin" / "python")
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(home / "bin"), env.get("PATH", "")])
    env["MYPY_CACHE_DIR"] = str(home / "mypy-cache")
    env.pop("PYTHONPATH", None)
    results = []
    for hook in _hooks(home, root):
        hook_id = hook["id"]
        stages = hook.get("stages")
        if stages and not {"pre-commit", "manual"} & set(stages):
            continue  # commit-msg hooks: the commits carry a sign-off
        chosen = selected(hook, files)
        always = hook.get("always_run", False)
        if not chosen and not always:
            continue
        args = [str(a) for a in hook.get("args", [])]
        passes = hook.get("pass_filenames", True)
        name = hook.get("alias") or hook_id
        if hook["repo"].endswith("/ruff-pre-commit") and hook_id in RUFF_HOOKS:
            if hook_id == "ruff-format":
                command = [str(home / "bin" / "ruff"), "format", "--check", *chosen]
            else:
                command = [str(home / "bin" / "ruff"), "check", "--no-fix", *chosen]
            result = _run(name, command, root, env)
            if result.status == FAILED and before is not None:
                result.output = _whose(hook_id, command, root, before, chosen, env)
            results.append(result)
        elif hook["repo"].endswith("/typos"):
            binary = _typos(home, config)
            if binary is None:
                results.append(Result(name, SKIPPED, output="typos is not installable"))
            else:
                results.append(_run(name, [str(binary), *args, *chosen], root, env))
        elif hook["repo"] == "local" and hook.get("language") in LOCAL_LANGUAGES:
            entry = shlex.split(hook["entry"])
            if entry[0] == "python":
                entry[0] = python
            elif hook["language"] == "script":
                entry[0] = str(root / entry[0])
            command = [*entry, *args, *(chosen if passes else [])]
            results.append(_run(name, command, root, env))
        else:
            why = f"needs {hook['repo']} ({hook.get('language', 'remote')})"
            results.append(Result(name, SKIPPED, output=why))
    return results


ADDED = "in lines this change adds"
OLD = "already in the tree before this change"
CAUSED = "caused by this change in a line it does not change"


def added_lines(root: Path, path: str) -> set[int]:
    """The lines of the staged file that the change adds (git diff --cached)."""
    diff = children.run(
        ["git", "-C", str(root), "diff", "--cached", "-U0", "--", path],
        capture_output=True,
        text=True,
    ).stdout
    found: set[int] = set()
    for match in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
        start, count = int(match.group(1)), int(match.group(2) or 1)
        found.update(range(start, start + count))
    return found


_NOQA = re.compile(r"\s*#\s*noqa\b.*$")


def _findings(ruff: str, tree: Path, files: list[str], env: dict) -> list[dict]:
    present = [f for f in files if (tree / f).is_file()]
    if not present:
        return []
    done = children.run(
        [ruff, "check", "--no-fix", "--output-format", "json", *present],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    try:
        found = json.loads(done.stdout or "[]")
    except json.JSONDecodeError:
        return []
    for finding in found:
        name = (tree / finding["filename"]).resolve()
        finding["path"] = str(name.relative_to(tree.resolve()))
        lines = (tree / finding["path"]).read_text(errors="replace").splitlines()
        row = finding["location"]["row"]
        finding["text"] = lines[row - 1].strip() if 0 < row <= len(lines) else ""
    return found


def classify(after: list[dict], before: list[dict], added: dict[str, set[int]]):
    """[(finding, whose)]: ADDED, OLD or CAUSED (see the module's text).
    A finding was in the tree before if one of the same rule, message and
    line text (but for a noqa comment) was (each earlier finding
    accounts for one later one)."""

    def key(f: dict) -> tuple:
        # the statement, not a linter's mark on it: a noqa comment the change
        # added to a line does not make the line's old finding the change's
        return (f["path"], f["code"], f["message"], _NOQA.sub("", f["text"]))

    earlier = Counter(key(f) for f in before)
    out = []
    for finding in after:
        key_ = key(finding)
        if finding["location"]["row"] in added.get(finding["path"], set()):
            whose = ADDED
        elif earlier[key_] > 0:
            earlier[key_] -= 1
            whose = OLD
        else:
            whose = CAUSED
        out.append((finding, whose))
    return out


def _whose(
    hook_id: str, command: list[str], root: Path, before: Path, files: list[str], env
) -> str:
    """The failing ruff's output, each finding (or file) saying whose it is."""
    ruff = command[0]
    if hook_id == "ruff-format":
        lines = []
        for path in files:
            check = [ruff, "format", "--check", path]
            if children.run(check, cwd=root, env=env, capture_output=True).returncode:
                was = (before / path).is_file() and children.run(
                    check, cwd=before, env=env, capture_output=True
                ).returncode
                why = "unformatted " + (OLD if was else "by this change")
                lines.append(f"Would reformat: {path} ({why})")
        return "\n".join(lines + [f"{len(lines)} file(s) would be reformatted"])
    found = classify(
        _findings(ruff, root, files, env),
        _findings(ruff, before, files, env),
        {path: added_lines(root, path) for path in files},
    )
    lines = [
        f"{f['path']}:{f['location']['row']}:{f['location']['column']}: "
        f"{f['code']} {f['message']} ({whose})"
        for f, whose in found
    ]
    counts = Counter(whose for _, whose in found)
    summary = "; ".join(f"{n} {whose}" for whose, n in counts.items())
    return "\n".join(lines + [f"Found {len(found)} error(s): {summary}"])


def report(results: list[Result]) -> str:
    return "\n".join(r.line() for r in results)


if __name__ == "__main__":  # python -m xpufakes.staging.treechecks ROOT FILE...
    found = run(Path(sys.argv[1]), sys.argv[2:])
    print(report(found))
    sys.exit(1 if any(r.status == FAILED for r in found) else 0)

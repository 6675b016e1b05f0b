"""`make esimd-schemas GIT=<intel/llm-scaler git dir>`: the maintainers'
command that reads llm-scaler's `custom_esimd_kernels_vllm` package
(vllm/custom-esimd-kernels-vllm/, which a vLLM tree of the image does not
carry) at each image commit and writes data/esimd_schemas.toml: every op
schema its C++ registers, file:line; what the function each op runs
returns and writes of its parameters, file:line (trees/kernelcxx.py); the
package's Python wrappers of its ops; the vLLM release the image builds
(its vllm/docker/Dockerfile's `git clone -b v<release>`). Git only, from
the directory given (the tool never reaches the network for it): the data
is committed, and `make audit` reads it."""

import json
import re
import subprocess
import tomllib
from pathlib import Path

from xpufakes.common import paths
from xpufakes.common.errors import Refusal
from xpufakes.trees import kernelcxx

DATA = paths.DATA / "esimd_schemas.toml"
PACKAGE = "vllm/custom-esimd-kernels-vllm/"
DOCKERFILE = "vllm/docker/Dockerfile"
_SOURCES = (".cc", ".cpp", ".sycl", ".h", ".hpp")


def _git(git_dir: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True
    )
    if done.returncode:
        raise Refusal(f"git {' '.join(args)} in {git_dir}: {done.stderr.strip()}")
    return done.stdout


def read(git_dir: Path, commit: str) -> dict:
    """The package's facts at an image commit (a dict as the data holds it)."""
    full = _git(git_dir, "rev-parse", f"{commit}^{{commit}}").strip()
    listing = _git(git_dir, "ls-tree", "-r", "--name-only", full, PACKAGE).split()
    if not listing:
        raise Refusal(f"{commit} has no {PACKAGE}")
    texts = {
        p[len(PACKAGE) :]: _git(git_dir, "show", f"{full}:{p}")
        for p in listing
        if p.endswith(_SOURCES) and p.startswith(f"{PACKAGE}csrc/")
    }
    python = {
        p[len(PACKAGE) :]: _git(git_dir, "show", f"{full}:{p}")
        for p in listing
        if p.endswith(".py") and "/python/" in f"/{p[len(PACKAGE) :]}"
    }
    return {
        "commit": full,
        "date": _git(git_dir, "show", "-s", "--format=%cs", full).strip(),
        **_release(git_dir, full),
        "ops": ops(texts),
        "wrappers": wrappers(python),
    }


def _release(git_dir: Path, full: str) -> dict:
    try:
        text = _git(git_dir, "show", f"{full}:{DOCKERFILE}")
    except Refusal:
        return {}
    for number, line in enumerate(text.splitlines(), 1):
        found = re.search(r"-b\s+v(\d+\.\d+\.\d+\S*)\s+\S*vllm-project/vllm", line)
        if found:
            return {"vllm": found.group(1), "vllm_from": f"{DOCKERFILE}:{number}"}
    return {}


def ops(texts: dict[str, str]) -> dict[str, dict]:
    """ "ns::name" -> its schema, where, its implementation and evidence."""
    definitions, impls, functions = [], {}, {}
    for path, text in sorted(texts.items()):
        definitions += kernelcxx.definitions(path, text)
        impls.update(kernelcxx.impls(path, text))
        for name, function in kernelcxx.functions(path, text).items():
            functions.setdefault(name, function)
    found = {}
    for d in definitions:
        op = f"{d.namespace}::{d.name}"
        entry = {"schema": d.schema, "defined": f"{d.file}:{d.line}"}
        impl = impls.get(op)
        returns, writes = [], []
        if impl is not None and impl.function in functions:
            fn = functions[impl.function]
            entry["impl"] = f"{fn.file}:{fn.line} {fn.name}"
            returns, writes = kernelcxx.evidence(fn, functions)
        elif impl is not None and impl.lambda_body:
            entry["impl"] = f"{impl.file}:{impl.line} a lambda"
            returns, writes = kernelcxx.lambda_evidence(
                impl, functions, texts[impl.file]
            )
        elif impl is not None:
            entry["impl"] = f"{impl.function} (not found in the package)"
        entry["returns"] = [_evidence(e) for e in returns]
        entry["writes"] = [_evidence(e) for e in writes]
        found[op] = entry
    return found


def _evidence(e: kernelcxx.Evidence) -> dict:
    return {"param": e.param, "how": e.how, "at": e.where}


def wrappers(python: dict[str, str]) -> dict[str, dict]:
    """The package's Python functions that call one op: name -> facts."""
    found = {}
    for path, text in sorted(python.items()):
        for w in kernelcxx.wrappers(path, text):
            if len(w.calls) != 1 or w.name.startswith("_"):
                continue
            op, args = w.calls[0]
            found.setdefault(
                w.name,
                {
                    "op": op,
                    "at": f"{w.file}:{w.line}",
                    "params": w.params,
                    "args": args,
                    "returns_op": w.returns_op,
                },
            )
    return found


# ---------------------------------------------------------------------------
# The data file
# ---------------------------------------------------------------------------

HEADER = """\
# intel/llm-scaler's `custom_esimd_kernels_vllm` package
# (vllm/custom-esimd-kernels-vllm/), by image commit: facts for `make audit`'s
# schema truth, which a vLLM tree of the image does not carry.
#
# Written by `make esimd-schemas GIT=<an intel/llm-scaler git dir>` (changes/
# esimdfacts.py, trees/kernelcxx.py) from the commits already here and those
# given (COMMITS=...); do not edit by hand. Paths are the package's.
#
# [<commit>]            vllm: the release its Dockerfile builds (vllm_from)
# [<commit>.ops."ns::op"]
#   schema, defined     the m.def string (whitespace normalised), file:line
#   impl                the function m.impl binds, file:line
#   returns, writes     what that function (or one it passes the parameter
#                       on to) returns / writes of its parameters: `how`
#                       (returned; stored through a pointer to its data, or
#                       such a pointer handed where the C++ does not show it
#                       read-only; an in-place method), file:line, the first
#                       evidence (trees/kernelcxx.py)
# [<commit>.wrappers.<f>]  custom_esimd_kernels_vllm.<f>: the op it calls,
#                       its parameters, what it passes (in the op's order),
#                       whether it returns the op's result
"""


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        if value and isinstance(value[0], dict):
            return "[\n" + "".join(f"    {_value(v)},\n" for v in value) + "]"
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(value)


def render(commits: dict[str, dict]) -> str:
    lines = [HEADER]
    for short, facts in commits.items():
        lines.append(f"[{short}]")
        for key in ("commit", "date", "vllm", "vllm_from"):
            if key in facts:
                lines.append(f"{key} = {_value(facts[key])}")
        lines.append("")
        for op, entry in facts["ops"].items():
            lines.append(f"[{short}.ops.{json.dumps(op)}]")
            lines += [f"{k} = {_value(v)}" for k, v in entry.items()]
            lines.append("")
        for name, entry in facts["wrappers"].items():
            lines.append(f"[{short}.wrappers.{name}]")
            lines += [f"{k} = {_value(v)}" for k, v in entry.items()]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def load() -> dict[str, dict]:
    return tomllib.loads(DATA.read_text()) if DATA.is_file() else {}


def write(git_dir: Path, commits: list[str]) -> tuple[Path, list[str]]:
    """Regenerate the data from `git_dir`: the commits it holds, and those
    given (a short hash of 7 names each)."""
    if not Path(git_dir).is_dir():
        raise Refusal(f"{git_dir}: not a directory (give an intel/llm-scaler git dir)")
    wanted = list(dict.fromkeys([*load(), *commits]))
    found = {}
    for commit in wanted:
        facts = read(Path(git_dir), commit)
        found[facts["commit"][:7]] = facts
    text = render(found)
    tomllib.loads(text)  # it reads back
    DATA.write_text(text)
    return DATA, list(found)

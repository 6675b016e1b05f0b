"""intel/llm-scaler's sym_int4 quantizer library, stood in: a ctypes
library built from q4_0_standin.c (its contract there)."""

import shutil
import subprocess
from pathlib import Path

Q4_0_SOURCE = Path(__file__).with_name("q4_0_standin.c")


def q4_0_library(directory: Path) -> Path:
    """intel/llm-scaler's sym_int4 loads its quantizer, a shared library,
    with ctypes (VLLM_QUANTIZE_Q40_LIB, the image's
    /opt/lib/vllm_int4_for_multi_arc.so) and calls it on the CPU while it
    processes the weights. A ctypes library has to be one: the stand-in
    (q4_0_standin.c, its contract there) built with the C compiler
    Inductor uses here too. Returns its path."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc) for the sym_int4 library stand-in")
    made = directory / "vllm_int4_for_multi_arc.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(made), str(Q4_0_SOURCE), "-lm"],
        check=True,
        capture_output=True,
    )
    return made

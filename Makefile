# Developer entry points. `make test` is what CI runs (.ci/run).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Stamp file: reinstall only when the dependency list changes.
STAMP := $(VENV)/.installed

.PHONY: venv test demo browser conformance

venv: $(STAMP)

# torch is installed first and exactly: a bare `torch` requirement can resolve to the
# multi-GB CUDA build, while this pin lets pip take the local CPU wheel.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install torch==2.13.0
	$(BIN)/python -m pip install -e '.[dev]'
	touch $(STAMP)

# Debian's Chromium, for rendering `plan --report` pages in tests/planner/export/test_html_report.py
# (about 45 s once, with apt-get update). Optional: without root, apt-get or Debian's packages
# it says so, and those tests skip.
browser:
	@command -v chromium >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] \
		&& timeout 300 apt-get update -qq && DEBIAN_FRONTEND=noninteractive timeout 600 \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null; } \
		|| echo "chromium not installed: the report's rendering tests will skip"

# The engines' own validators of `plan --emit` files, none needing a GPU (about 60 s and
# 50 MB once, most of it building DeepSpeed's wheel; tests/planner/export/test_engines.py):
# DeepSpeed (the `conformance` extra, no CUDA ops built), TorchTitan 0.2 (--no-deps: its
# config and ParallelDims need only tyro) and megatron-core's training package (it declares
# Python >= 3.12, but its argument parser runs on 3.11). torch==2.13.0 is named in each
# install so none can move it. Optional: where an install fails it says so, and those
# checks skip.
CONFORMANCE := $(VENV)/.conformance
$(CONFORMANCE): $(STAMP)
	DS_BUILD_OPS=0 $(BIN)/python -m pip install torch==2.13.0 -e '.[dev,conformance]' \
		|| echo "DeepSpeed not installed: its conformance checks will skip"
	$(BIN)/python -m pip install --no-deps torch==2.13.0 torchtitan==0.2.2 \
		|| echo "TorchTitan 0.2 not installed: its conformance checks will skip"
	$(BIN)/python -m pip install --no-deps --ignore-requires-python torch==2.13.0 \
		'megatron-core>=0.17,<0.20' \
		|| echo "megatron-core not installed: Megatron-LM's own parser checks will skip"
	touch $(CONFORMANCE)

# TorchTitan 0.3 (its dataclass configs, after pytorch/torchtitan#2386), whose pins clash
# with TorchTitan 0.2's above: a venv of its own that sees .venv's torch 2.13.0 through a .pth
# file and installs with --no-deps what `import torchtitan.trainer` needs, so nothing can move
# torch (tests/planner/export/test_torchtitan_config.py; about 1.3 GB once, most of it triton
# and pyarrow, which its modules import). Optional: where the install fails those checks skip.
TITAN03 := $(VENV)/torchtitan-0.3
$(TITAN03)/.installed: $(STAMP)
	test -x $(TITAN03)/bin/python || $(PYTHON) -m venv $(TITAN03)
	$(BIN)/python -c 'import site; print(site.getsitepackages()[0])' \
		> "$$($(TITAN03)/bin/python -c 'import site; print(site.getsitepackages()[0])')/tessel-main.pth"
	$(TITAN03)/bin/python -m pip install -q --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro \
		docstring_parser typeguard torchdata tensorboard triton datasets multiprocess pyarrow \
		dill xxhash || echo "TorchTitan 0.3 not installed: its conformance checks will skip"
	touch $@

conformance: $(CONFORMANCE) $(TITAN03)/.installed

test: venv browser conformance
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q --durations=15 tests

demo: venv
	$(BIN)/plan gpt3-175b --cluster dgx-a100-80g --gpus 1024 --global-batch-size 1536
	$(BIN)/plan check demo:mlp --mesh 4 --steps 3
	$(BIN)/plan check llama --num-layers 4 --hidden-size 64 --num-attention-heads 4 \
		--vocab-size 256 --seq-length 16 --gpus 8 --global-batch-size 16 \
		--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --steps 3
